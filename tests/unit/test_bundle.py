"""The model bundle: what it carries, and what a job's process gets back from it."""

from __future__ import annotations

import linecache
import subprocess
import sys
import textwrap

import pytest

from elasticdl_nb.capture import write_bundle
from elasticdl_nb.model import BundleError, load_bundle

CELL = textwrap.dedent("""
    import tensorflow as tf

    def custom_model():
        return tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1)])

    def loss(labels, predictions):
        if tf.reduce_mean(predictions) > 1e9:  # Python control flow: needs AutoGraph
            return tf.reduce_mean(predictions) * 0.0
        return tf.reduce_mean(tf.square(labels - predictions))

    def optimizer():
        return tf.keras.optimizers.SGD(0.1)
""")


def _notebook_functions():
    """Functions as a notebook cell defines them: the source lives only in linecache."""
    filename = "<ipython-input-7-0123456789ab>"
    linecache.cache[filename] = (len(CELL), None, CELL.splitlines(True), filename)
    namespace = {"__name__": "__main__"}
    exec(compile(CELL, filename, "exec"), namespace)  # noqa: S102
    return {k: namespace[k] for k in ("custom_model", "loss", "optimizer")}


def test_functions_from_a_notebook_keep_their_source_so_autograph_converts_them(tmp_path):
    write_bundle(tmp_path / "bundle", functions=_notebook_functions())
    probe = textwrap.dedent(f"""
        from pathlib import Path
        import tensorflow as tf
        from elasticdl_nb.model import load_bundle
        contract = load_bundle(Path({str(tmp_path / "bundle")!r}))
        print(float(tf.function(contract.loss)(tf.ones([3, 1]), tf.zeros([3, 1]))))
    """)
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == "1.0"


def test_a_model_zoo_module_is_copied_and_its_function_named(tmp_path):
    zoo = tmp_path / "zoo.py"
    zoo.write_text(CELL)
    manifest = write_bundle(tmp_path / "bundle", model_zoo=str(zoo), model_def="custom_model")
    assert manifest["model_def"] == "zoo.custom_model"
    assert load_bundle(tmp_path / "bundle").optimizer().__class__.__name__ == "SGD"


def test_a_model_def_naming_a_missing_module_is_refused(tmp_path):
    (tmp_path / "zoo").mkdir()
    with pytest.raises(BundleError, match="no module 'mnist.py'"):
        write_bundle(
            tmp_path / "bundle", model_zoo=str(tmp_path / "zoo"), model_def="mnist.custom_model"
        )


def _with_python(bundle, version):
    import json

    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["python"] = version
    (bundle / "manifest.json").write_text(json.dumps(manifest))


def test_pickled_values_from_another_python_are_refused_source_alone_is_not(tmp_path):
    functions = _notebook_functions()
    write_bundle(tmp_path / "source", functions=functions)
    _with_python(tmp_path / "source", "3.9")
    assert load_bundle(tmp_path / "source").optimizer().__class__.__name__ == "SGD"

    functions["optimizer"] = lambda: None  # a lambda has no source of its own: pickled
    write_bundle(tmp_path / "pickled", functions=functions)
    _with_python(tmp_path / "pickled", "3.9")
    with pytest.raises(BundleError, match="python 3.9 but this process runs python 3.11"):
        load_bundle(tmp_path / "pickled")


def test_a_module_file_edited_after_import_does_not_ship_the_wrong_source(tmp_path):
    import importlib.util

    from elasticdl_nb.capture.autograph import sources_of

    path = tmp_path / "edited_zoo.py"
    path.write_text("def loss(labels, predictions):\n    return labels - predictions\n")
    spec = importlib.util.spec_from_file_location("edited_zoo", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert sources_of({"loss": module.loss})["functions"] == {"loss": str(path)}

    # Lines added above it: the code object's line 1 is now a comment, not its def.
    path.write_text("# a\n# b\n# c\n" + path.read_text())
    linecache.checkcache(str(path))
    assert sources_of({"loss": module.loss})["functions"] == {}


def test_threads_loading_a_captured_bundle_at_once_each_get_its_contract(tmp_path):
    # A master's evaluator and its callbacks' loader may load at the same moment: each
    # load takes the captured module out of sys.modules first (seen in CI: KeyError).
    import threading

    write_bundle(tmp_path / "bundle", functions=_notebook_functions())

    def load(start, got, errors):
        start.wait()
        try:
            got.append(load_bundle(tmp_path / "bundle"))
        except Exception as exc:  # noqa: BLE001  (what the test looks for)
            errors.append(exc)

    for _ in range(5):
        start, got, errors = threading.Barrier(6), [], []
        threads = [threading.Thread(target=load, args=(start, got, errors)) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert errors == [] and len(got) == 6
        assert all(c.optimizer().__class__.__name__ == "SGD" for c in got)
