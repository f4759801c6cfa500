"""The examples run headless, as `make demo` runs them, and do what they say."""

from __future__ import annotations

import re
import shutil

import nbformat
import pytest

from examples.run_quickstart import run

pytestmark = pytest.mark.slow


def test_quickstart_notebook_trains_digits_to_90_percent(job_home, tmp_path):
    notebook = tmp_path / "quickstart.ipynb"
    shutil.copy("examples/quickstart.ipynb", notebook)
    executed = nbformat.read(run(notebook), as_version=4)
    outputs = [out for cell in executed.cells if cell.cell_type == "code" for out in cell.outputs]
    assert not [out for out in outputs if out.output_type == "error"]
    text = "\n".join(out.get("text", "") for out in outputs)
    accuracy = float(re.search(r"test accuracy: ([0-9.]+)", text).group(1))
    assert accuracy >= 0.90
    assert re.search(r"succeeded after \d+ steps", text)
    # The job ran under the test's home, not the user's.
    assert len(list((job_home / "jobs").iterdir())) == 1
