"""Model capture: what a notebook defines, turned into files a job's processes import.

`collect` walks from the contract functions (or a Keras model object) to everything they
use; `module_file.write` writes it as a readable module plus pickled values, Keras
archives and copied modules. See `collect` for how each kind of object travels.
`write_bundle` makes the model bundle a job carries, from those or a model-zoo module.
"""

from elasticdl_nb.capture.bundle_writer import write_bundle
from elasticdl_nb.capture.collect import Capture, collect
from elasticdl_nb.capture.values import CaptureError

__all__ = ["Capture", "CaptureError", "collect", "write_bundle"]
