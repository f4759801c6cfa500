"""The Python SDK: start, find, watch and steer elastic training jobs."""

from elasticdl_nb.sdk.api import attach, jobs, train
from elasticdl_nb.sdk.job import Job, JobFailed

__all__ = ["Job", "JobFailed", "attach", "jobs", "train"]
