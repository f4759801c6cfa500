"""Tests for elasticdl_nb.data.staging: writing in-memory arrays as an npy source."""

import os

import numpy as np
import pytest

from elasticdl_nb.data import DataError, open_reader, resolve_sources, stage_arrays


def read_all(directory: str):
    [source] = resolve_sources(directory)
    return source, open_reader(source).read(0, source.num_records)


def test_round_trip_through_resolve_and_reader(tmp_path):
    x = np.random.default_rng(0).normal(size=(25, 4)).astype(np.float32)
    y = np.arange(25) % 2
    directory = stage_arrays(x, y, str(tmp_path / "staged"))
    assert directory == str(tmp_path / "staged")
    source, (features, labels) = read_all(directory)
    assert (source.format, source.num_records) == ("npy", 25)
    np.testing.assert_array_equal(features, x)
    np.testing.assert_array_equal(labels, y)
    assert features.dtype == np.float32 and labels.dtype == y.dtype


def test_dict_features_round_trip_per_key(tmp_path):
    x = {"age": np.arange(5, dtype=np.int32), "image": np.ones((5, 3, 3), dtype=np.uint8)}
    directory = stage_arrays(x, None, str(tmp_path / "staged"))
    assert sorted(os.listdir(directory)) == ["x.age.npy", "x.image.npy"]
    _, features = read_all(directory)
    assert sorted(features) == ["age", "image"]
    for key, array in x.items():
        np.testing.assert_array_equal(features[key], array)


def test_list_features_and_bool_labels_are_converted(tmp_path):
    directory = stage_arrays([[1, 2], [3, 4], [5, 6]], [True, False, True], str(tmp_path / "s"))
    _, (features, labels) = read_all(directory)
    assert features.tolist() == [[1, 2], [3, 4], [5, 6]]
    assert labels.dtype == np.bool_ and labels.tolist() == [True, False, True]


def test_restaging_replaces_previous_arrays_and_labels(tmp_path):
    directory = str(tmp_path / "staged")
    stage_arrays({"a": np.zeros(3), "b": np.zeros(3)}, np.zeros(3), directory)
    stage_arrays(np.ones((2, 2)), None, directory)
    assert sorted(os.listdir(directory)) == ["x.npy"]
    source, features = read_all(directory)
    assert source.num_records == 2
    np.testing.assert_array_equal(features, np.ones((2, 2)))


def test_staging_leaves_unrelated_files_alone(tmp_path):
    directory = tmp_path / "staged"
    directory.mkdir()
    (directory / "notes.txt").write_text("keep me")
    stage_arrays(np.zeros(2), None, str(directory))
    assert sorted(os.listdir(directory)) == ["notes.txt", "x.npy"]


def test_no_temporary_files_are_left_behind(tmp_path):
    directory = stage_arrays(np.zeros((3, 2)), np.zeros(3), str(tmp_path / "staged"))
    assert sorted(os.listdir(directory)) == ["x.npy", "y.npy"]


def test_different_lengths_error_names_arrays_and_lengths(tmp_path):
    with pytest.raises(DataError) as caught:
        stage_arrays(np.zeros((10, 2)), np.zeros(9), str(tmp_path / "staged"))
    message = str(caught.value)
    assert "x has 10 records but y has 9" in message and "same first dimension" in message
    assert not (tmp_path / "staged").exists()


def test_different_lengths_in_dict_features_name_the_keys(tmp_path):
    with pytest.raises(DataError, match=r"x\['a'\] has 3 records but x\['b'\] has 4"):
        stage_arrays({"a": np.zeros(3), "b": np.zeros(4)}, None, str(tmp_path / "s"))


def test_failed_validation_keeps_previously_staged_data(tmp_path):
    directory = stage_arrays(np.zeros(3), np.ones(3), str(tmp_path / "staged"))
    with pytest.raises(DataError):
        stage_arrays(np.zeros(4), np.ones(5), directory)
    source, (_, labels) = read_all(directory)
    assert source.num_records == 3 and labels.tolist() == [1.0, 1.0, 1.0]


def test_object_array_error_says_convert_to_numbers(tmp_path):
    x = np.array([{"a": 1}, {"b": 2}], dtype=object)
    with pytest.raises(DataError) as caught:
        stage_arrays(x, None, str(tmp_path / "staged"))
    message = str(caught.value)
    assert "x has dtype object" in message and "convert it to numbers" in message


def test_string_features_stage_as_fixed_width_strings(tmp_path):
    # String ids for elasticdl_nb.layers.Embedding, which hashes them; an object array of
    # Python strings becomes fixed width (an object array cannot be memory-mapped).
    x = np.array([["user:1", "ad:22"], ["user:333", "ad:4"]], dtype=object)
    directory = stage_arrays(x, np.array([0.0, 1.0]), str(tmp_path / "staged"))
    _, (features, _) = read_all(directory)
    assert features.dtype.kind == "U"
    np.testing.assert_array_equal(features, x.astype(str))


def test_string_labels_are_rejected(tmp_path):
    with pytest.raises(DataError, match="y has dtype <U3"):
        stage_arrays(np.zeros(2), np.array(["cat", "dog"]), str(tmp_path / "staged"))


def test_ragged_lists_are_rejected_with_a_padding_hint(tmp_path):
    with pytest.raises(DataError, match="x cannot be turned into a NumPy array.*ragged"):
        stage_arrays([[1, 2], [3]], None, str(tmp_path / "staged"))


def test_zero_records_are_rejected(tmp_path):
    with pytest.raises(DataError, match="x has 0 records"):
        stage_arrays(np.zeros((0, 3)), np.zeros(0), str(tmp_path / "staged"))


def test_scalar_is_rejected(tmp_path):
    with pytest.raises(DataError, match="y is a scalar"):
        stage_arrays(np.zeros(1), 5, str(tmp_path / "staged"))


@pytest.mark.parametrize("key", ["my key", "1st", "a.b", ""])
def test_non_identifier_feature_keys_are_rejected(tmp_path, key):
    with pytest.raises(DataError, match="not a valid identifier"):
        stage_arrays({key: np.zeros(2)}, None, str(tmp_path / "staged"))


def test_empty_feature_dict_is_rejected(tmp_path):
    with pytest.raises(DataError, match="empty dict"):
        stage_arrays({}, None, str(tmp_path / "staged"))
