"""IPython magics: `%load_ext elasticdl_nb`, then `%%elasticdl train` and `%elasticdl <command>`.

`%elasticdl -h` lists the commands; each takes `-h`. A wrong command or flag prints the
usage and the reason, never a traceback.
"""

from __future__ import annotations

import os

from elasticdl_nb.magics.commands import ElasticDLMagics


def load_ipython_extension(ipython) -> None:
    # TensorFlow's C++ start-up notices (oneDNN, CPU features) would otherwise land in
    # the training cell's output as red stderr; a user who wants them sets the variable.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    ipython.register_magics(ElasticDLMagics)


__all__ = ["ElasticDLMagics", "load_ipython_extension"]
