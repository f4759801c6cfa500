"""ElasticDL's import paths (elasticdl_nb/elasticdl_imports.py), each case in a fresh
interpreter: they work once elasticdl_nb is imported, through a finder on sys.meta_path
(nothing is put into sys.modules before a module is imported), a module we do not
provide fails naming the ones we do, and an installed ElasticDL wins."""

import os
import subprocess
import sys
import textwrap


def run(code: str, **env) -> str:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **env},
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_model_zoo_imports_name_ours_once_elasticdl_nb_is_imported():
    out = run(
        """
        import sys
        import elasticdl_nb
        print("before", sorted(m for m in sys.modules if m.split(".")[0] == "elasticdl"))
        from elasticdl.python.common.constants import Mode
        from elasticdl.python.elasticdl.callbacks import LearningRateScheduler
        from elasticdl.python.elasticdl.layers.embedding import Embedding
        import elasticdl_nb.callbacks, elasticdl_nb.layers
        print("same", Mode is elasticdl_nb.Mode, Embedding is elasticdl_nb.layers.Embedding,
              LearningRateScheduler is elasticdl_nb.callbacks.LearningRateScheduler)
        print("finder", type(sys.modules["elasticdl"].__loader__).__name__)
        """
    )
    assert "before []" in out  # a hook, not modules written in advance
    assert "same True True True" in out
    assert "finder ElasticDLPaths" in out


def test_an_elasticdl_module_we_do_not_provide_says_which_ones_we_do():
    out = run(
        """
        import elasticdl_nb
        try:
            from elasticdl.python.worker.worker import Worker
        except ModuleNotFoundError as exc:
            print(exc.name, "|", exc)
        """
    )
    name, message = out.split(" | ")
    assert name == "elasticdl.python.worker.worker"
    assert "elasticdl.python.elasticdl.layers.embedding" in message
    assert "elasticdl.python.worker.prediction_outputs_processor" in message
    assert "install ElasticDL" in message


def test_an_installed_elasticdl_wins(tmp_path):
    package = tmp_path / "elasticdl" / "python" / "common"
    package.mkdir(parents=True)
    for directory in (package.parent.parent, package.parent, package):
        (directory / "__init__.py").write_text("")
    (package / "constants.py").write_text("class Mode:\n    REAL = True\n")
    out = run(
        """
        import elasticdl_nb
        from elasticdl.python.common.constants import Mode
        print("real", getattr(Mode, "REAL", False))
        try:
            import elasticdl.python.elasticdl.layers.embedding
        except ModuleNotFoundError as exc:
            print("missing", exc.name)
        """,
        PYTHONPATH=str(tmp_path),
    )
    assert "real True" in out
    # A module the real ElasticDL lacks is not made up by ours either.
    assert "missing elasticdl.python.elasticdl" in out
