"""Tie a job process to the process that started it: when that one dies, so does it.

A local job's supervisor starts the master, the workers and the PS, and names itself in
`PARENT_ENV`: if the supervisor dies, the whole job goes with it, while a master that
dies takes nothing with it (the supervisor starts another, and the workers and PS wait
for it). Where nobody sets `PARENT_ENV` (a pod), there is no lifeline.

The process asks the kernel for SIGKILL when its parent goes (PR_SET_PDEATHSIG) as the
first thing it does, then checks the parent did not go before that. Doing this in the
child instead of in a `preexec_fn` keeps the parent's fork free of Python code: forking a
process that runs threads and then running code before exec can abort the child.
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
    if os.getppid() != parent:  # the parent died before we asked
        os._exit(1)
