"""JobSpec: the one place options are checked, with messages that say the fix."""

import pytest

from elasticdl_nb.spec import JobSpec, SpecError


def test_unknown_option_names_the_closest_known_one():
    with pytest.raises(SpecError, match="Unknown option 'worker'. Did you mean 'workers'"):
        JobSpec.from_options(data="x.csv", worker=2)


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("workers", 0, "'workers' must be at least 1"),
        ("ps", 0, "'ps' must be at least 1"),
        ("minibatch_size", -5, "'minibatch_size' must be at least 1"),
        ("epochs", 1.5, "'epochs' must be an integer"),
        ("shuffle", "yes", "'shuffle' must be True or False"),
        ("backend", "yarn", "'backend' must be one of local"),
        ("name", "My Job", "Job name 'My Job' is not valid"),
        ("csv_delimiter", ";;", "csv_delimiter= must be one character"),
    ],
)
def test_bad_values_fail_with_the_option_named(option, value, message):
    with pytest.raises(SpecError, match=message):
        JobSpec.from_options(data="x.csv", **{option: value})


def test_zero_workers_says_to_stop_instead():
    with pytest.raises(SpecError, match="stop the job instead"):
        JobSpec.from_options(data="x.csv", workers=0)


def test_model_zoo_without_model_def_is_refused():
    with pytest.raises(SpecError, match="model_def= is empty"):
        JobSpec.from_options(data="x.csv", model_zoo="zoo/")


def test_arrays_given_as_a_file_option_point_to_the_sdk():
    import numpy as np

    with pytest.raises(SpecError, match=r"elasticdl_nb.train\(data=\(x, y\)\)"):
        JobSpec.from_options(data=np.zeros(3))


def test_a_single_path_becomes_a_list_and_the_spec_round_trips_through_json(tmp_path):
    spec = JobSpec.from_options(
        data=tmp_path / "a.csv", workers=3, minibatch_size=16, minibatches_per_task=4
    )
    assert spec.data == [str(tmp_path / "a.csv")]
    assert spec.records_per_task == 64
    assert JobSpec.from_json(spec.to_json()) == spec
