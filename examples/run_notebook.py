"""Run an example notebook headless and say what it trained (`make demo`: the quickstart).

The notebook is executed with nbclient in a real Jupyter kernel, exactly as a user would
run it; the executed copy (with every output, and the dashboard's widget state) is
written beside it.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent


def run(notebook: Path = HERE / "quickstart.ipynb") -> Path:
    nb = nbformat.read(notebook, as_version=4)
    started = time.monotonic()
    NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(HERE)}}
    ).execute()
    executed = notebook.with_suffix(".executed.ipynb")
    nbformat.write(nb, executed)
    text = "\n".join(
        out.get("text", "")
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
        if out.get("output_type") == "stream"
    )
    job = re.search(r"Started job (\S+)", text)
    state = re.search(r"^(succeeded|failed|stopped) after (\d+) steps", text, re.MULTILINE)
    print(f"Ran {notebook.name}: job {job.group(1) if job else '?'}", end="")
    print(f" {state.group(1)} after {state.group(2)} steps." if state else ".")
    for line in text.splitlines():  # what the notebook says it reached
        if line.startswith(("Started job", "test accuracy:", "AUC:")):
            print(line)
    print(f"Executed notebook: {executed} ({time.monotonic() - started:.0f} s)")
    return executed


if __name__ == "__main__":
    run(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "quickstart.ipynb")
