"""IPython magics: `%load_ext elasticdl_nb`, then `%%elasticdl train` and `%elasticdl <command>`.

`%elasticdl -h` lists the commands; each takes `-h`. A wrong command or flag prints one
line, the reason (the closest flag, or the choices), not the usage; any other mistake a
user can fix (an `ElasticDLError`: no such job, no such log, a bad option, and a job that
failed) prints `%elasticdl <command>: <message>` on stderr, the options it names spelt as
the magic's flags. Neither shows a traceback.

    elasticdl_magic   the `%elasticdl` line/cell magic: parse, run (commands/), show
    train             `%%elasticdl train`: the model and data from the notebook's namespace
    config            the notebook's defaults for new jobs (`%elasticdl config`)
"""

from __future__ import annotations

import os

from elasticdl_nb.magics.elasticdl_magic import ElasticDLMagics


def load_ipython_extension(ipython) -> None:
    # TensorFlow's C++ start-up notices (oneDNN, CPU features) would otherwise land in
    # the training cell's output as red stderr; a user who wants them sets the variable.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    ipython.register_magics(ElasticDLMagics)


__all__ = ["ElasticDLMagics", "load_ipython_extension"]
