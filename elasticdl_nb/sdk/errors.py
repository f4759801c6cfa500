"""What the SDK raises about a job: no such job, no such log, not running, failed.

Each is an `ElasticDLError` (front ends show its message, no traceback) and keeps the
built-in type the SDK raised before, so `except LookupError` and the like still work.
"""

from __future__ import annotations

from elasticdl_nb.errors import ElasticDLError


class JobFailed(ElasticDLError, RuntimeError):
    """The job ended in `failed`; the message is the master's reason."""


class JobNotFound(ElasticDLError, LookupError):
    """No job by that name here (or in the namespace given); the message lists the known."""


class JobNotRunning(ElasticDLError, ValueError):
    """The job's master is not running, so it cannot be steered (scaled) any more."""


class ScaleRefused(ElasticDLError, ValueError):
    """The master refused the new number of workers, or could not be reached."""


class UnknownRole(ElasticDLError, ValueError):
    """A role other than master, worker and ps."""


class NoSuchLog(ElasticDLError, FileNotFoundError):
    """That process has no log (yet); the message lists the logs there are."""


class NoModelYet(ElasticDLError, FileNotFoundError):
    """The job has not exported its trained model (it does when it succeeds)."""


class NoPredictionsYet(ElasticDLError, LookupError):
    """The job has no predictions to read: it has no prediction data, or has not
    predicted for all of it yet (it does once trained, before the export)."""


class IdleWorkersWarning(UserWarning):
    """A job asks for more workers than an epoch of its data has tasks: the rest wait."""
