"""Every error a user can act on is an `ElasticDLError` (the front ends catch only that and
show its message), and still the built-in type callers caught before."""

from __future__ import annotations

import pytest

import elasticdl_nb as edl
from elasticdl_nb.backends.job_records import JobExists
from elasticdl_nb.backends.kubernetes.api import KubernetesError
from elasticdl_nb.backends.local.submit import LaunchError
from elasticdl_nb.capture.values import CaptureError
from elasticdl_nb.data import DataError
from elasticdl_nb.errors import ElasticDLError
from elasticdl_nb.model import BundleError, ContractError
from elasticdl_nb.sdk.preflight import PreflightError


@pytest.mark.parametrize(
    "error, builtin",
    [
        (edl.SpecError, ValueError),
        (DataError, ValueError),
        (ContractError, ValueError),
        (BundleError, ValueError),
        (PreflightError, ValueError),
        (CaptureError, ValueError),
        (KubernetesError, RuntimeError),
        (LaunchError, RuntimeError),
        (JobExists, ValueError),
        (edl.JobFailed, RuntimeError),
        (edl.JobNotFound, LookupError),
        (edl.JobNotRunning, ValueError),
        (edl.ScaleRefused, ValueError),
        (edl.UnknownRole, ValueError),
        (edl.NoSuchLog, FileNotFoundError),
        (edl.NoModelYet, FileNotFoundError),
    ],
    ids=lambda value: value.__name__,
)
def test_every_user_facing_error_is_an_elasticdl_error_and_keeps_its_builtin_type(error, builtin):
    assert issubclass(error, ElasticDLError) and issubclass(error, builtin)
    raised = error("the cause, and the fix")
    assert str(raised) == "the cause, and the fix"


def test_the_package_exports_the_base_class():
    assert edl.ElasticDLError is ElasticDLError
