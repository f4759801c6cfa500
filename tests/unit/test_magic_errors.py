"""What a new user's mistakes read like in `%elasticdl` (a real IPython shell) and the CLI:
one line that says the fix, in the flags of the front end they are typing in."""

from __future__ import annotations

import numpy as np
import pytest

from elasticdl_nb import cli
from elasticdl_nb.commands import in_flags
from elasticdl_nb.magics.train import resolve_data

# A model the magic finds in the cell; every mistake below is found before it is built.
CELL = "def custom_model():\n    pass\ndef loss(labels, predictions):\n    pass\n"


@pytest.fixture()
def shell(ipython_shell, job_home):
    ipython_shell.user_ns.update(x_train=np.zeros((4, 3)), y_train=np.zeros(4))
    yield ipython_shell
    for name in ("custom_model", "loss", "x_train", "y_train"):
        ipython_shell.user_ns.pop(name, None)


def magic_err(shell, capsys, line: str, cell: str | None = None) -> str:
    """What the magic printed on stderr (nothing may go to stdout: no usage)."""
    if cell is None:
        assert shell.run_line_magic("elasticdl", line) is None
    else:
        assert shell.run_cell_magic("elasticdl", line, cell) is None
    out, err = capsys.readouterr()
    assert out == "" and "usage:" not in err and "Traceback" not in err
    return err


def test_an_unknown_flag_is_one_line_naming_the_closest_option(shell, capsys):
    err = magic_err(shell, capsys, "train --batch-size 32 --data x_train y_train", CELL)
    assert err == "%%elasticdl train: unknown option --batch-size: did you mean --minibatch-size?\n"

    err = magic_err(shell, capsys, "logs somejob --roel worker")
    assert err == "%elasticdl logs: unknown option --roel: did you mean --role?\n"

    err = magic_err(shell, capsys, "train --frobnicate", CELL)
    assert (
        err == "%%elasticdl train: unknown option --frobnicate: `%%elasticdl train -h` lists them\n"
    )

    err = magic_err(shell, capsys, "config workrs=3")  # the notebook's defaults: by name
    assert err.startswith("%elasticdl config: Cannot set 'workrs=3': did you mean workers? ")


def test_an_invalid_choice_is_one_line_listing_the_choices(shell, capsys):
    err = magic_err(shell, capsys, "train --strategy foo --data x_train y_train", CELL)
    assert err == (
        "%%elasticdl train: argument --strategy: invalid choice: 'foo' "
        "(choose from ps, allreduce)\n"
    )

    err = magic_err(shell, capsys, "trian")
    assert err.startswith("%elasticdl: argument command: invalid choice: 'trian' (choose from ")
    assert err.endswith("; did you mean train?\n") and err.count("\n") == 1


def test_the_cli_shares_the_one_line_errors(capsys):
    assert cli.main(["train", "--batch-size", "32"]) == cli.USER_ERROR
    assert capsys.readouterr().err == (
        "python -m elasticdl_nb train: error: unknown option --batch-size: "
        "did you mean --minibatch-size?\n"
    )
    assert cli.main(["train", "--data-format", "parquet"]) == cli.USER_ERROR
    err = capsys.readouterr().err
    assert "invalid choice: 'parquet' (choose from auto, csv, tfrecord, npy)" in err
    assert err.count("\n") == 1


def test_a_data_name_neither_variable_nor_path_says_both(shell, capsys):
    err = magic_err(shell, capsys, "train --data x_trian y_train", CELL)
    assert err.startswith(
        "%elasticdl train: --data x_trian: no notebook variable named x_trian and no file "
        "matches x_trian (did you mean x_train?)."
    )
    assert "No job was launched." in err

    err = magic_err(shell, capsys, "train --data x_train labels.csv", CELL)
    assert "x_train is a notebook variable, the rest paths" in err

    err = magic_err(shell, capsys, "train --data x_train", CELL)
    assert "--data x_train: one array, without labels: name the labels' array too" in err


def test_a_data_name_that_is_a_file_is_a_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rows").write_text("1,2\n")
    assert resolve_data({}, "data", ["rows"]) == ["rows"]
    assert resolve_data({"rows": (1, 2)}, "data", ["rows"]) == (1, 2)  # a variable first


def test_prediction_data_is_features_alone():
    x = np.zeros((3, 2))
    assert resolve_data({"x_new": x}, "prediction_data", ["x_new"]) is x


def test_hints_name_the_magics_own_flags(shell, capsys):
    err = magic_err(shell, capsys, "status no-such-job")
    assert "pass --namespace." in err and "namespace=" not in err

    err = magic_err(shell, capsys, "train --data x_train y_train --workers 0", CELL)
    assert "%elasticdl train: Option --workers must be at least 1, got 0." in err

    line = "train --data x_train y_train --strategy allreduce --overlap-communication"
    err = magic_err(shell, capsys, line, CELL)
    assert "Drop --overlap-communication or use --strategy ps." in err


@pytest.mark.parametrize(
    "sdk, flags",
    [
        ("(a job from elsewhere: pass namespace=.)", "(a job from elsewhere: pass --namespace.)"),
        ("or use strategy='ps'.", "or use --strategy ps."),
        ("pass master_priority_class='', ", "pass --master-priority-class '', "),
        ("(worker_resources=, ps_resources=)", "(--worker-resources, --ps-resources)"),
        ("Drop tls=True; shuffle=False", "Drop --tls; --no-shuffle"),
        ("Option 'max_memory': too big", "Option --max-memory: too big"),
        # Python to copy, and names that are not options, stay as they are.
        ("elasticdl_nb.train(data=(x, y))", None),
        ("model.compile(optimizer='adam', loss=...)", None),
        ("Unknown option 'worker'.", None),
    ],
)
def test_an_errors_options_read_as_flags_in_a_command_line(sdk, flags):
    if flags is None:
        assert in_flags(sdk) == sdk
    else:
        assert in_flags(sdk) == flags


def test_status_says_a_finished_job_s_last_epoch_and_final_phase(capsys):
    from elasticdl_nb.magics.elasticdl_magic import SHOW

    # what a 3-epoch job's master says once it succeeded (epoch counted from 0)
    status = {
        "name": "digits",
        "state": "succeeded",
        "phase": "done",
        "epoch": 2,
        "epochs": 3,
        "step": 132,
        "records_done": 1400,
        "records_per_epoch": 1400,
        "records_per_second": 0.0,
    }
    assert SHOW["status"](status) is status  # the dict is still the cell's value
    assert capsys.readouterr().out == (
        "digits: succeeded | phase done | epoch 3/3 | 1400/1400 records (100%) | step 132 | "
        "0 rec/s\n"
    )
