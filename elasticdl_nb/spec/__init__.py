"""The one description of a job: every option, its default, its help and its check."""

from elasticdl_nb.spec.jobspec import (
    JobSpec,
    SpecError,
    closest,
    format_workers,
    option_fields,
    worker_range,
)

__all__ = ["JobSpec", "SpecError", "closest", "format_workers", "option_fields", "worker_range"]
