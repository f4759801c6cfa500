"""Tie a worker or PS process to its master: when the master dies, so does it.

The process asks the kernel for SIGKILL when its parent goes (PR_SET_PDEATHSIG) as the
first thing it does, then checks the parent did not go before that. Doing this in the
child instead of in a `preexec_fn` keeps the master's fork free of Python code: forking a
process that runs gRPC threads and then running code before exec can abort the child.
"""

from __future__ import annotations

import ctypes
import os
import signal

PARENT_ENV = "ELASTICDL_NB_PARENT_PID"
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    parent = int(os.environ.get(PARENT_ENV, "0"))
    if not parent:
        return
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the master died before we asked
        os._exit(1)
