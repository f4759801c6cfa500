"""`ElasticDLError`: the base of every error a user can act on.

Its message is one paragraph that names the cause and the fix. Front ends (the magics,
the CLI, the server extension) show that message and nothing else: a traceback is for
our bugs, never for a user's mistake. Each layer raises its own subclass (`SpecError`,
`DataError`, `ContractError`, `KubernetesError`, `JobFailed`, ...), and most also keep
the built-in type they replaced (`ValueError`, `LookupError`, ...) so that callers that
caught that still do.

This module sits below everything (it imports nothing of ours).
"""

from __future__ import annotations


class ElasticDLError(Exception):
    """A problem the user can fix, or a job outcome to report: show its message only."""
