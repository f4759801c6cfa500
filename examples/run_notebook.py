"""`make demo`: run examples/quickstart.ipynb headless and say what it trained.

The notebook is executed with nbclient in a real Jupyter kernel, exactly as a user would
run it; the executed copy (with every output) is written beside it.
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
    accuracy = re.search(r"test accuracy: ([0-9.]+)", text)
    job = re.search(r"started job (\S+)", text)
    print(
        f"Trained a digits classifier (64 -> 64 -> 10, 8 epochs) as job "
        f"{job.group(1) if job else '?'} with 2 workers and 1 parameter server."
    )
    print(f"Test accuracy: {accuracy.group(1) if accuracy else 'not found'}")
    print(f"Executed notebook: {executed} ({time.monotonic() - started:.0f} s)")
    return executed


if __name__ == "__main__":
    run(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "quickstart.ipynb")
