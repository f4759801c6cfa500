"""The model contract (ElasticDL's model zoo) and the bundle that carries it to a job."""

from elasticdl_nb.model.bundle import BundleError, load_bundle, write_bundle
from elasticdl_nb.model.contract import ContractError, Mode, ModelContract

__all__ = ["BundleError", "ContractError", "Mode", "ModelContract", "load_bundle", "write_bundle"]
