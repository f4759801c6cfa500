"""The live job dashboard: `show(job)`.

In a notebook (an IPython kernel, which is what draws widgets: JupyterLab, Notebook,
VS Code, and nbclient/nbconvert runs, which store the widget state in the notebook) it
displays a `Dashboard` (dashboard.py) and returns it. Elsewhere (terminal IPython, a plain
script), or with `text=True`, a daemon thread prints compact text progress
(`elasticdl_nb.sdk.progress.ProgressPrinter`) until the job ends, and `show` returns None.
Both read the same `JobView` (`elasticdl_nb.sdk.view`): the journal is folded there once.

`Dashboard` (and with it ipywidgets and plotly, a second to import) is loaded only when
a dashboard is shown.

The modules: dashboard.py is the `Dashboard` widget and its two threads, dashboard_html.py
draws its status and details as HTML, live_figure.py is its plotly figure, which sends
each update as one message.
"""

from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING, Any, TextIO

from elasticdl_nb.sdk.view import JobLike

if TYPE_CHECKING:
    from elasticdl_nb.widgets.dashboard import Dashboard

__all__ = ["Dashboard", "show", "widget_frontend_available"]


def __getattr__(name: str) -> Any:
    if name == "Dashboard":
        from elasticdl_nb.widgets.dashboard import Dashboard

        return Dashboard
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def widget_frontend_available() -> bool:
    """True inside an IPython kernel (a ZMQ shell with a kernel), where widgets render."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    zmqshell = sys.modules.get("ipykernel.zmqshell")  # loaded in every kernel; never import it
    if shell is None or zmqshell is None:
        return False
    return isinstance(shell, zmqshell.ZMQInteractiveShell) and shell.kernel is not None


def show(
    job: JobLike, *, text: bool | None = None, out: TextIO | None = None, **options: Any
) -> Dashboard | None:
    """Show the progress of `job`: the live dashboard where widgets can be drawn (returned),
    else text progress printed by a daemon thread (returns None). `text=True` forces the
    text, `text=False` the dashboard; `out` is where the text goes (sys.stdout); `options`
    go to `Dashboard`."""
    if text is None:
        text = not widget_frontend_available()
    if not text:
        from IPython.display import display

        from elasticdl_nb.widgets.dashboard import Dashboard, _execution_count

        dashboard = Dashboard(job, **options)
        display(dashboard)
        dashboard._shown_in = _execution_count()  # not displayed again as the cell's value
        return dashboard
    thread = threading.Thread(
        target=print_progress, args=(job, out), name=f"edl-progress-{job.name}", daemon=True
    )
    thread.start()
    return None


def print_progress(job: JobLike, out: TextIO | None = None) -> None:
    """Print the job's progress as compact text until its events end."""
    from elasticdl_nb.sdk.progress import ProgressPrinter

    printer = ProgressPrinter(job.name, out)
    try:
        for event in job.events(from_seq=0, follow=True):
            printer.show(event)
    except Exception as exc:  # say so rather than let the thread die silently
        (out or sys.stdout).write(f"\n[{job.name}] progress stopped: {exc!r}\n")
