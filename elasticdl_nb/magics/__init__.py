"""IPython magics: `%load_ext elasticdl_nb`, then `%elasticdl <command>`.

`%elasticdl -h` lists the commands; each takes `-h`. A wrong command or flag prints the
usage and the reason, never a traceback.
"""

from __future__ import annotations

from elasticdl_nb.magics.line import ElasticDLMagics


def load_ipython_extension(ipython) -> None:
    ipython.register_magics(ElasticDLMagics)


__all__ = ["ElasticDLMagics", "load_ipython_extension"]
