"""A parameter-server process: `python -m elasticdl_nb.runtime.ps --id N`.

The lifeline to the master is set first, before the slow imports (TensorFlow) of
`process.py`, so a master that dies meanwhile takes this process with it. The heap
settings come before even that: they hold only for threads that had not allocated yet
(heap.py), and those imports start threads.
"""

from elasticdl_nb.runtime.heap import keep_freed_memory
from elasticdl_nb.runtime.lifeline import die_with_parent

keep_freed_memory()
die_with_parent()

from elasticdl_nb.runtime import profiling  # noqa: E402
from elasticdl_nb.runtime.ps.process import main  # noqa: E402

profiling.run(main, "ps")
