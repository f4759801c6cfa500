"""The one description of a job: every option, its default, its help and its check."""

from elasticdl_nb.spec.jobspec import JobSpec, SpecError, option_fields

__all__ = ["JobSpec", "SpecError", "option_fields"]
