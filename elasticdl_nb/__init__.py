"""elasticdl-nb: train a Keras model as an elastic, fault-tolerant parameter-server job.

    import elasticdl_nb as edl
    job = edl.train(custom_model, loss=loss, optimizer=optimizer, data=(x, y), workers=2)
    job.wait(); model = job.model()

Importing this package does not import TensorFlow; the SDK imports it when it needs it.
"""

from elasticdl_nb.errors import ElasticDLError
from elasticdl_nb.model.contract import Mode
from elasticdl_nb.sdk import Job, JobFailed, attach, jobs, train
from elasticdl_nb.sdk.errors import (
    JobNotFound,
    JobNotRunning,
    NoModelYet,
    NoSuchLog,
    ScaleRefused,
    UnknownRole,
)
from elasticdl_nb.spec import JobSpec, SpecError

__version__ = "0.1.0"


def load_ipython_extension(ipython) -> None:
    """`%load_ext elasticdl_nb`: the `%elasticdl` magics (see elasticdl_nb/magics/)."""
    from elasticdl_nb.magics import load_ipython_extension as load

    load(ipython)


__all__ = [
    "ElasticDLError",
    "Job",
    "JobFailed",
    "JobNotFound",
    "JobNotRunning",
    "JobSpec",
    "Mode",
    "NoModelYet",
    "NoSuchLog",
    "ScaleRefused",
    "SpecError",
    "UnknownRole",
    "attach",
    "jobs",
    "train",
]
