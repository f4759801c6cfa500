"""`ElasticDLError`: the base of every error a user can act on.

Its message is one paragraph that names the cause and the fix. Front ends (the magics,
the CLI, the server extension) catch this class, and only this, and show that message
and nothing else: a traceback is for our bugs, never for a user's mistake. Each layer
raises its own subclass (`SpecError`, `DataError`, `ContractError`, `CaptureError`,
`KubernetesError`, `LaunchError`; the SDK's in `sdk/errors.py`: `JobNotFound`,
`NoSuchLog`, `JobFailed`, ...), and each keeps the built-in type it replaced
(`ValueError`, `LookupError`, `FileNotFoundError`, `RuntimeError`) so that callers that
caught that still do. `tests/unit/test_errors.py` lists them all.

This module sits below everything (it imports nothing of ours).
"""

from __future__ import annotations


class ElasticDLError(Exception):
    """A problem the user can fix, or a job outcome to report: show its message only."""
