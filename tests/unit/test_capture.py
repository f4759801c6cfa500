"""Model capture from a real IPython shell: each kind of definition, and each refusal.

The cells run in a real `InteractiveShell`, so their source lives where IPython keeps it;
bundles are loaded back in a fresh Python process, as a job's worker loads them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from elasticdl_nb.capture import CaptureError, collect, write_bundle
from elasticdl_nb.capture.module_file import MODULE


@pytest.fixture(scope="module")
def shell(ipython_shell):
    return ipython_shell


def run(shell, cell: str) -> dict:
    result = shell.run_cell(textwrap.dedent(cell))
    assert result.success, result.error_in_exec or result.error_before_exec
    return shell.user_ns


def load_in_fresh_process(bundle: Path, probe: str) -> list:
    """Load the bundle in a new interpreter and return what `probe` (an expression over
    the loaded `contract`) evaluates to, as JSON."""
    code = textwrap.dedent(f"""
        import json
        from pathlib import Path
        import numpy as np
        import tensorflow as tf
        from elasticdl_nb.model import load_bundle
        contract = load_bundle(Path({str(bundle)!r}))
        print("RESULT", json.dumps({probe}))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT ") :])


def test_notebook_functions_classes_constants_and_imports_travel_as_source(shell, tmp_path):
    ns = run(
        shell,
        """
        import numpy as np
        import keras
        from keras import layers
        from numpy import square as np_square
        SCALE = 3.0
        UNUSED_BIG = list(range(100000))

        def scaled(x):
            return x * SCALE

        class Scale(layers.Layer):
            def call(self, x):
                return scaled(x)

        def cap_model():
            return keras.Sequential([keras.Input((2,)), Scale(), layers.Dense(1, use_bias=False,
                kernel_initializer="ones")])

        def cap_loss(labels, predictions):
            return keras.ops.mean(keras.ops.square(labels - predictions)) + np_square(0.0)

        def cap_optimizer():
            return keras.optimizers.SGD(0.1)
        """,
    )
    entries = {
        "custom_model": ns["cap_model"],
        "loss": ns["cap_loss"],
        "optimizer": ns["cap_optimizer"],
    }
    capture = collect(entries, ns)
    assert set(capture.definitions) == {"scaled", "Scale", "cap_model", "cap_loss", "cap_optimizer"}
    assert capture.literals == {"SCALE": "3.0"}
    assert capture.values == {}  # nothing pickled: UNUSED_BIG is not used, so not shipped
    assert capture.imports == {
        "np_square": "from numpy import square as np_square",
        "keras": "import keras",
        "layers": "from keras import layers",
    }

    manifest = write_bundle(tmp_path / "b", functions=entries)
    assert manifest["kind"] == "captured" and manifest["requires"] == []
    text = (tmp_path / "b" / "source" / f"{MODULE}.py").read_text()
    # The class comes after what its statement needs, and the contract names are bound.
    assert text.index("class Scale(layers.Layer)") > text.index("from keras import layers")
    assert "custom_model = cap_model" in text and "loss = cap_loss" in text
    out = load_in_fresh_process(
        tmp_path / "b",
        "[float(contract.custom_model()(np.ones((1, 2))).numpy()[0, 0]),"
        " float(contract.loss(np.zeros((1, 1)), np.ones((1, 1)))),"
        " type(contract.optimizer()).__name__]",
    )
    assert out == [6.0, 1.0, "SGD"]  # (1 + 1) * 3.0 through the Dense of ones


def test_a_compiled_keras_model_travels_as_config_and_weights_with_its_loss_and_optimizer(
    shell, tmp_path
):
    ns = run(
        shell,
        """
        import keras
        import numpy as np
        keras.utils.set_random_seed(1)
        net = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
        net.compile(optimizer=keras.optimizers.Adam(0.125),
                    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        expected = net(np.ones((1, 4))).numpy().tolist()
        """,
    )
    write_bundle(tmp_path / "b", functions={"custom_model": ns["net"]})
    assert (tmp_path / "b" / "source" / "models" / "net.keras").exists()
    out = load_in_fresh_process(
        tmp_path / "b",
        "[contract.custom_model()(np.ones((1, 4))).numpy().tolist(),"
        " float(contract.optimizer().learning_rate),"
        " float(contract.loss(np.array([0]), np.zeros((1, 3))))]",
    )
    assert out[0][0] == pytest.approx(ns["expected"][0])
    assert out[1] == 0.125
    assert out[2] == pytest.approx(float(__import__("math").log(3)))


def test_a_compiled_model_beside_a_notebook_keras_that_is_tf_keras(shell, tmp_path):
    # The notebook's `keras` is TensorFlow's; the compiled model's loss and optimizer are
    # written with Keras under a name of their own, so the two do not clash.
    ns = run(
        shell,
        """
        from tensorflow import keras
        tf_net = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        tf_net.compile(optimizer="sgd", loss="mse")

        def tf_metrics():
            return {"mae": keras.metrics.MeanAbsoluteError()}
        """,
    )
    entries = {"custom_model": ns["tf_net"], "eval_metrics_fn": ns["tf_metrics"]}
    write_bundle(tmp_path / "b", functions=entries)
    text = (tmp_path / "b" / "source" / f"{MODULE}.py").read_text()
    # (by TensorFlow's name: in a Keras-2 job's process that is tf_keras, as it should be)
    assert "from tensorflow import keras" in text and "import keras as _keras" in text
    out = load_in_fresh_process(
        tmp_path / "b",
        "[type(contract.optimizer()).__name__, list(contract.eval_metrics_fn()),"
        " float(contract.loss(np.zeros((1, 1)), np.ones((1, 1))))]",
    )
    assert out == ["SGD", ["mae"], 1.0]


def test_values_that_are_not_literals_are_pickled_and_local_modules_copied(shell, tmp_path):
    local = tmp_path / "mylocalmod.py"
    local.write_text("def offset():\n    return 5\n")
    sys.path.insert(0, str(tmp_path))
    try:
        ns = run(
            shell,
            """
            import numpy as np
            import mylocalmod
            VOCAB = {f"w{i}": i for i in range(500)}
            TABLE = np.arange(6.0)

            def v_model():
                import keras
                return keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])

            def v_loss(labels, predictions):
                return float(VOCAB["w7"] + TABLE[2] + mylocalmod.offset())

            v_opt = lambda: None
            """,
        )
        entries = {"custom_model": ns["v_model"], "loss": ns["v_loss"], "optimizer": ns["v_opt"]}
        manifest = write_bundle(tmp_path / "b", functions=entries)
        assert manifest["requires"] == ["python", "tensorflow"]
        assert (tmp_path / "b" / "source" / "mylocalmod.py").exists()
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("mylocalmod", None)
    summary = (tmp_path / "b" / "captured.txt").read_text()
    assert "value: TABLE, VOCAB, optimizer" in summary and "module: mylocalmod" in summary
    out = load_in_fresh_process(tmp_path / "b", "[contract.loss(0, 0), contract.optimizer()]")
    assert out == [7 + 2.0 + 5, None]


@pytest.mark.parametrize(
    "definition, what",
    [
        ("BAD = open(__file__ if '__file__' in dir() else '/dev/null')", "an open file"),
        ("import threading\nBAD = threading.Lock()", "a lock"),
        ("BAD = (i for i in range(3))", "a generator"),
        ("import tensorflow as tf\nBAD = tf.data.Dataset.range(3)", "a tf.data.Dataset"),
        (
            "class Unpicklable:\n    def __reduce__(self):\n        raise TypeError('no')\n"
            "BAD = Unpicklable()",
            "cannot be pickled",
        ),
    ],
    ids=["file", "lock", "generator", "dataset", "unpicklable"],
)
def test_what_only_lives_in_this_process_is_refused_by_name(shell, definition, what):
    ns = run(shell, definition + "\n\ndef uses_bad():\n    return BAD\n")
    with pytest.raises(CaptureError) as error:
        collect({"custom_model": ns["uses_bad"]}, ns)
    message = str(error.value)
    assert "Cannot capture 'BAD' (used by uses_bad)" in message and what in message
    assert "Fix:" in message


def test_a_capture_over_the_size_limit_names_the_largest_values(shell, tmp_path):
    ns = run(
        shell,
        """
        import numpy as np
        HUGE = np.zeros(3 * 2**20 // 8)  # 3 MB
        SMALL = np.zeros(10)

        def big_model():
            return HUGE.sum() + SMALL.sum()
        """,
    )
    with pytest.raises(CaptureError, match=r"takes 3\.0 MB, over the 2 MB limit \(largest: HUGE"):
        write_bundle(tmp_path / "b", functions={"custom_model": ns["big_model"]}, limit=2 * 2**20)
