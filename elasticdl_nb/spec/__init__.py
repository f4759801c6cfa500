"""The one description of a job: every option, its default, its help and its check."""

from elasticdl_nb.spec.jobspec import JobSpec, SpecError, closest, option_fields

__all__ = ["JobSpec", "SpecError", "closest", "option_fields"]
