"""The example notebooks run headless in a real kernel, as `make demo` runs them, and do
what they say: train, show the dashboard, and reach their accuracy."""

from __future__ import annotations

import re
import shutil

import nbformat
import pytest

from examples.run_notebook import run

pytestmark = pytest.mark.slow


def _execute(name: str, tmp_path) -> tuple[list, str, dict]:
    notebook = tmp_path / name
    shutil.copy(f"examples/{name}", notebook)
    executed = nbformat.read(run(notebook), as_version=4)
    outputs = [out for cell in executed.cells if cell.cell_type == "code" for out in cell.outputs]
    assert not [out for out in outputs if out.output_type == "error"]
    text = "\n".join(out.get("text", "") for out in outputs)
    widget_state = executed.metadata.get("widgets", {}).get(
        "application/vnd.jupyter.widget-state+json", {}
    )
    return outputs, text, widget_state.get("state", {})


def _dashboard_shown(outputs: list, state: dict) -> None:
    """The training cell displayed the dashboard, and its final state was stored."""
    views = [o for o in outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert views, "no widget was displayed"
    by_kind: dict[str, list] = {}
    for model in state.values():
        by_kind.setdefault(model["model_name"], []).append(model["state"])
    assert {"HTMLModel", "ButtonModel", "TextModel", "AnyModel"} <= set(by_kind)
    html = " ".join(m.get("value", "") for m in by_kind["HTMLModel"])
    # The final state: the job succeeded, the bar is full, the table lists the instances.
    assert 'role="progressbar"' in html and 'aria-valuenow="100.0"' in html
    assert "succeeded" in html and 'class="edl-instances"' in html and ">worker<" in html
    figure = next(m for m in by_kind["AnyModel"] if "_py2js_update" in m)
    assert "training loss" in str(figure)


def test_quickstart_notebook_trains_digits_to_90_percent_with_the_dashboard(job_home, tmp_path):
    outputs, text, state = _execute("quickstart.ipynb", tmp_path)
    accuracy = float(re.search(r"test accuracy: ([0-9.]+)", text).group(1))
    assert accuracy >= 0.90
    assert re.search(r"succeeded after \d+ steps", text)
    assert "Keras model: model;" in text
    _dashboard_shown(outputs, state)
    # The job ran under the test's home, not the user's.
    assert len(list((job_home / "jobs").iterdir())) == 1


def test_ctr_notebook_learns_most_of_the_reachable_auc(job_home, tmp_path):
    outputs, text, state = _execute("ctr_embeddings.ipynb", tmp_path)
    learned, best = map(
        float, re.search(r"AUC: learned ([0-9.]+), ground truth ([0-9.]+)", text).groups()
    )
    assert learned >= 0.5 + 0.7 * (best - 0.5)
    assert (
        "source: custom_model, eval_metrics_fn, loss, optimizer; value: DIM, FIELDS, VOCAB" in text
    )
    _dashboard_shown(outputs, state)


def test_hashed_features_notebook_learns_from_strings_with_bounded_tables(job_home, tmp_path):
    outputs, text, state = _execute("hashed_features.ipynb", tmp_path)
    learned, best = map(
        float, re.search(r"AUC: learned ([0-9.]+), ground truth ([0-9.]+)", text).groups()
    )
    assert learned >= 0.5 + 0.6 * (best - 0.5)
    rows = {
        m[0]: [int(v.replace(",", "")) for v in m[1:]]
        for m in re.findall(
            r"(\w+)/embeddings\s+rows\s+([\d,]+)\s+created\s+([\d,]+)\s+evicted\s+([\d,]+)\s+refused\s+([\d,]+)",
            text,
        )
    }
    assert set(rows) == {"user", "ad", "site", "hour"}
    assert rows["user"][0] <= 8_000 * 1.05 and rows["user"][2] > 0  # capped: it evicted
    assert all(refused > 0 for _, _, _, refused in [rows["user"], rows["ad"]])
    _dashboard_shown(outputs, state)
