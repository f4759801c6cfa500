"""A parameter-server process: `python -m elasticdl_nb.runtime.ps --id N`.

The lifeline to the master is set first, before the slow imports (TensorFlow) of
`process.py`, so a master that dies meanwhile takes this process with it.
"""

from elasticdl_nb.runtime.lifeline import die_with_parent

die_with_parent()

from elasticdl_nb.runtime import profiling  # noqa: E402
from elasticdl_nb.runtime.ps.process import main  # noqa: E402

profiling.run(main, "ps")
