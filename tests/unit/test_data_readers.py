"""Tests for elasticdl_nb.data.readers and default_decode_csv: reading record ranges."""

import csv
import io
from pathlib import Path

import numpy as np
import pytest

from elasticdl_nb.data import (
    DataError,
    SourceInfo,
    default_decode_csv,
    open_reader,
    resolve_sources,
)

QUOTED_CSV = (
    'name,city,score\n"Smith, J","Paris, FR",1.5\nplain,"say ""hi""",2\n"a,b,c",x,3\nlast,y,4\n'
)


def write_csv_rows(path: Path, header: list[str] | None, rows: list[list[str]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    if header is not None:
        writer.writerow(header)
    writer.writerows(rows)
    path.write_text(buffer.getvalue(), encoding="utf-8")
    return str(path)


def single_source(path: str, **options) -> SourceInfo:
    [source] = resolve_sources(path, **options)
    return source


def tfrecord_file(tmp_path: Path, count: int) -> tuple[str, list[bytes]]:
    tf = pytest.importorskip("tensorflow")
    path = str(tmp_path / "data.tfrecord")
    payloads = []
    with tf.io.TFRecordWriter(path) as writer:
        for i in range(count):
            feature = {
                # Variable-size records so offsets are not a fixed stride.
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=[1.0] * (i % 5))),
                "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
            }
            example = tf.train.Example(features=tf.train.Features(feature=feature))
            payload = example.SerializeToString()
            payloads.append(payload)
            writer.write(payload)
    return path, payloads


# --- csv ------------------------------------------------------------------


def test_csv_slices_equal_the_corresponding_lines(tmp_path):
    rows = [[str(i), f"{i * 0.5}", f"label{i % 3}"] for i in range(50)]
    path = write_csv_rows(tmp_path / "a.csv", ["id", "value", "label"], rows)
    reader = open_reader(single_source(path))
    for start, end in [(0, 50), (0, 1), (49, 50), (7, 23), (23, 24), (10, 50)]:
        table = reader.read(start, end)
        assert table.shape == (end - start, 3)
        assert table.tolist() == rows[start:end]


def test_csv_reader_exposes_header_column_names(tmp_path):
    path = write_csv_rows(tmp_path / "a.csv", ["f1", " f2 ", "label"], [["1", "2", "3"]])
    assert open_reader(single_source(path)).column_names == ["f1", "f2", "label"]


def test_csv_without_header_reads_first_line_as_data_and_names_columns(tmp_path):
    rows = [["1", "2", "3"], ["4", "5", "6"]]
    path = write_csv_rows(tmp_path / "a.csv", None, rows)
    reader = open_reader(single_source(path, csv_header=False), csv_header=False)
    assert reader.column_names == ["c0", "c1", "c2"]
    assert reader.read(0, 2).tolist() == rows


def test_csv_quoted_fields_with_commas_are_parsed(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text(QUOTED_CSV, encoding="utf-8")
    reader = open_reader(single_source(str(path)))
    assert reader.read(0, 2).tolist() == [
        ["Smith, J", "Paris, FR", "1.5"],
        ["plain", 'say "hi"', "2"],
    ]
    assert reader.read(2, 4).tolist() == [["a,b,c", "x", "3"], ["last", "y", "4"]]


def test_csv_blank_lines_crlf_and_bom_do_not_shift_records(tmp_path):
    path = tmp_path / "a.csv"
    path.write_bytes("\ufeffa,b\r\n\r\n1,2\r\n\n3,4\r\n\n\n5,6".encode())
    reader = open_reader(single_source(str(path)))
    assert reader.column_names == ["a", "b"]
    assert reader.read(0, 3).tolist() == [["1", "2"], ["3", "4"], ["5", "6"]]
    assert reader.read(1, 2).tolist() == [["3", "4"]]


def test_csv_semicolon_delimiter(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text("a;b\n1,5;2\n", encoding="utf-8")
    source = single_source(str(path), csv_delimiter=";")
    assert open_reader(source, csv_delimiter=";").read(0, 1).tolist() == [["1,5", "2"]]


def test_csv_empty_range_keeps_column_count(tmp_path):
    path = write_csv_rows(tmp_path / "a.csv", ["a", "b", "c"], [["1", "2", "3"]])
    table = open_reader(single_source(path)).read(1, 1)
    assert table.shape == (0, 3)


def test_csv_rows_feed_tensorflow_as_strings(tmp_path):
    tf = pytest.importorskip("tensorflow")
    path = write_csv_rows(tmp_path / "a.csv", ["a", "b"], [["1", "x"], ["2", "y"]])
    dataset = tf.data.Dataset.from_tensor_slices(open_reader(single_source(path)).read(0, 2))
    assert dataset.element_spec.dtype == tf.string
    assert [row.tolist() for row in dataset.as_numpy_iterator()] == [[b"1", b"x"], [b"2", b"y"]]


def test_csv_row_with_wrong_field_count_names_record_and_delimiter(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text("a,b,c\n1,2,3\n4,5\n", encoding="utf-8")
    with pytest.raises(DataError) as caught:
        open_reader(single_source(str(path))).read(0, 2)
    message = str(caught.value)
    assert "record 1 has 2 fields" in message and "3 columns" in message
    assert "csv_delimiter" in message


def test_csv_quoted_line_break_is_reported(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text('a,b\n"multi\nline",1\n2,3\n', encoding="utf-8")
    source = single_source(str(path))  # Counted as 3 lines: 3 records.
    with pytest.raises(DataError, match="line break"):
        open_reader(source).read(0, 3)


def test_csv_file_changed_since_counting_is_reported(tmp_path):
    path = write_csv_rows(tmp_path / "a.csv", ["a"], [["1"], ["2"]])
    source = single_source(path)
    with open(path, "a", encoding="utf-8") as file:
        file.write("3\n")
    with pytest.raises(DataError, match="now has 3 records but had 2"):
        open_reader(source).read(0, 1)


def test_csv_index_is_built_once_per_reader(tmp_path, monkeypatch):
    from elasticdl_nb.data import csv_lines

    path = write_csv_rows(tmp_path / "a.csv", ["a"], [[str(i)] for i in range(10)])
    calls = []
    original = csv_lines.nonempty_line_starts
    monkeypatch.setattr(csv_lines, "nonempty_line_starts", lambda p: calls.append(p) or original(p))
    reader = open_reader(single_source(path))
    for start in range(0, 10, 2):
        reader.read(start, start + 2)
    assert calls == [path]


# --- tfrecord ---------------------------------------------------------------


def test_tfrecord_slices_equal_tensorflow_records(tmp_path):
    tf = pytest.importorskip("tensorflow")
    path, payloads = tfrecord_file(tmp_path, 40)
    tf_records = [record.numpy() for record in tf.data.TFRecordDataset(path)]
    assert tf_records == payloads
    reader = open_reader(single_source(path))
    for start, end in [(0, 40), (0, 1), (39, 40), (5, 17), (17, 40)]:
        records = reader.read(start, end)
        assert records.dtype == object and records.shape == (end - start,)
        assert records.tolist() == tf_records[start:end]


def test_tfrecord_records_parse_back_in_tensorflow(tmp_path):
    tf = pytest.importorskip("tensorflow")
    path, _ = tfrecord_file(tmp_path, 6)
    records = open_reader(single_source(path)).read(2, 5)
    spec = {"id": tf.io.FixedLenFeature([], tf.int64)}
    dataset = tf.data.Dataset.from_tensor_slices(records).map(
        lambda r: tf.io.parse_single_example(r, spec)["id"]
    )
    assert list(dataset.as_numpy_iterator()) == [2, 3, 4]


def test_tfrecord_empty_and_trailing_zero_bytes_payloads_survive(tmp_path):
    tf = pytest.importorskip("tensorflow")
    path = str(tmp_path / "raw.tfrecord")
    payloads = [b"", b"a\x00", b"\x00\x00", b"xyz"]
    with tf.io.TFRecordWriter(path) as writer:
        for payload in payloads:
            writer.write(payload)
    assert open_reader(single_source(path)).read(0, 4).tolist() == payloads


def test_tfrecord_empty_range_is_an_empty_object_array(tmp_path):
    path, _ = tfrecord_file(tmp_path, 3)
    records = open_reader(single_source(path)).read(2, 2)
    assert records.shape == (0,) and records.dtype == object


# --- npy ------------------------------------------------------------------


def staged_dir(tmp_path: Path, arrays: dict[str, np.ndarray]) -> str:
    directory = tmp_path / "staged"
    directory.mkdir()
    for name, array in arrays.items():
        np.save(directory / name, array)
    return str(directory)


def test_npy_slices_return_features_and_labels(tmp_path):
    x = np.arange(30, dtype=np.float32).reshape(10, 3)
    y = np.arange(10, dtype=np.int64) * 7
    directory = staged_dir(tmp_path, {"x.npy": x, "y.npy": y})
    features, labels = open_reader(single_source(directory)).read(3, 8)
    np.testing.assert_array_equal(features, x[3:8])
    np.testing.assert_array_equal(labels, y[3:8])
    assert features.dtype == np.float32 and labels.dtype == np.int64


def test_npy_dict_features_are_sliced_per_key(tmp_path):
    age = np.arange(6)
    pixels = np.arange(24, dtype=np.uint8).reshape(6, 2, 2)
    y = np.linspace(0, 1, 6)
    directory = staged_dir(tmp_path, {"x.age.npy": age, "x.pixels.npy": pixels, "y.npy": y})
    features, labels = open_reader(single_source(directory)).read(1, 4)
    assert sorted(features) == ["age", "pixels"]
    np.testing.assert_array_equal(features["age"], age[1:4])
    np.testing.assert_array_equal(features["pixels"], pixels[1:4])
    np.testing.assert_array_equal(labels, y[1:4])


def test_npy_without_labels_returns_features_only(tmp_path):
    x = np.arange(8).reshape(4, 2)
    directory = staged_dir(tmp_path, {"x.npy": x})
    features = open_reader(single_source(directory)).read(0, 4)
    assert isinstance(features, np.ndarray)
    np.testing.assert_array_equal(features, x)


def test_npy_slices_are_copies_not_memory_maps(tmp_path):
    directory = staged_dir(tmp_path, {"x.npy": np.zeros((4, 2)), "y.npy": np.zeros(4)})
    features, labels = open_reader(single_source(directory)).read(0, 2)
    for array in (features, labels):
        assert not isinstance(array, np.memmap)
        assert array.flags.owndata and array.flags.writeable


def test_npy_empty_range_keeps_structure_and_trailing_shape(tmp_path):
    directory = staged_dir(
        tmp_path, {"x.a.npy": np.zeros((4, 3)), "x.b.npy": np.zeros(4), "y.npy": np.zeros(4)}
    )
    features, labels = open_reader(single_source(directory)).read(2, 2)
    assert features["a"].shape == (0, 3) and features["b"].shape == (0,)
    assert labels.shape == (0,)


# --- ranges -----------------------------------------------------------------


def test_end_beyond_num_records_is_an_error_for_every_format(tmp_path):
    csv_path = write_csv_rows(tmp_path / "a.csv", ["a"], [["1"], ["2"]])
    npy_dir = staged_dir(tmp_path, {"x.npy": np.zeros(2)})
    for path in (csv_path, npy_dir):
        with pytest.raises(DataError, match=r"\[0, 3\) is outside source .* has 2 records"):
            open_reader(single_source(path)).read(0, 3)


def test_end_beyond_num_records_is_an_error_for_tfrecord(tmp_path):
    path, _ = tfrecord_file(tmp_path, 2)
    with pytest.raises(DataError, match="has 2 records"):
        open_reader(single_source(path)).read(1, 3)


def test_negative_start_is_an_error(tmp_path):
    path = write_csv_rows(tmp_path / "a.csv", ["a"], [["1"], ["2"]])
    with pytest.raises(DataError, match="outside source"):
        open_reader(single_source(path)).read(-1, 1)


def test_start_after_end_gives_an_empty_result(tmp_path):
    path = write_csv_rows(tmp_path / "a.csv", ["a", "b"], [["1", "2"], ["3", "4"]])
    assert open_reader(single_source(path)).read(2, 1).shape == (0, 2)


# --- default_decode_csv -------------------------------------------------------


def test_default_decode_uses_last_column_as_label():
    rows = np.array([["1", "2.5", "0"], ["-3", " 4 ", "1"]], dtype=object)
    features, labels = default_decode_csv(rows, ["a", "b", "y"], None)
    np.testing.assert_array_equal(features, np.array([[1, 2.5], [-3, 4]], np.float32))
    np.testing.assert_array_equal(labels, np.array([0, 1], np.float32))
    assert features.dtype == np.float32 and labels.dtype == np.float32


def test_default_decode_named_label_column_is_removed_from_features():
    rows = np.array([["9", "1", "2"], ["8", "3", "4"]], dtype=object)
    features, labels = default_decode_csv(rows, ["y", "a", "b"], "y")
    np.testing.assert_array_equal(features, np.array([[1, 2], [3, 4]], np.float32))
    np.testing.assert_array_equal(labels, np.array([9, 8], np.float32))


def test_default_decode_works_on_reader_output(tmp_path):
    path = write_csv_rows(tmp_path / "a.csv", ["f", "label"], [["0.5", "1"], ["1.5", "0"]])
    reader = open_reader(single_source(path))
    features, labels = default_decode_csv(reader.read(0, 2), reader.column_names, "label")
    assert features.shape == (2, 1) and labels.tolist() == [1.0, 0.0]


def test_default_decode_non_numeric_value_names_column_and_value():
    rows = np.array([["1", "2", "0"], ["3", "red", "1"], ["x", "blue", "1"]], dtype=object)
    with pytest.raises(DataError) as caught:
        default_decode_csv(rows, ["a", "colour", "y"], None)
    message = str(caught.value)
    assert "column 'colour'" in message and "'red'" in message and "row 1" in message
    assert "feed function" in message


def test_default_decode_empty_field_is_called_out():
    rows = np.array([["1", ""]], dtype=object)
    with pytest.raises(DataError, match=r"column 'y' has the non-numeric value '' \(empty\)"):
        default_decode_csv(rows, ["a", "y"], None)


def test_default_decode_unknown_label_column_lists_columns():
    rows = np.array([["1", "2"]], dtype=object)
    with pytest.raises(DataError, match=r"'target' is not among the CSV columns \(a, b\)"):
        default_decode_csv(rows, ["a", "b"], "target")


def test_default_decode_empty_batch_has_right_shapes():
    features, labels = default_decode_csv(np.empty((0, 3), dtype=object), ["a", "b", "c"], "b")
    assert features.shape == (0, 2) and labels.shape == (0,)
