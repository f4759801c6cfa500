"""The model contract (ElasticDL's model zoo) and loading the bundle that carries it to a
job (`elasticdl_nb.capture.write_bundle` writes one)."""

from elasticdl_nb.model.bundle import BundleError, load_bundle
from elasticdl_nb.model.contract import ContractError, Mode, ModelContract

__all__ = ["BundleError", "ContractError", "Mode", "ModelContract", "load_bundle"]
