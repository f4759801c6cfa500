"""Tests for elasticdl_nb.data.sources: finding inputs, detecting formats, counting records."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from elasticdl_nb.data import DataError, SourceInfo, resolve_sources, stage_arrays

REPO_ROOT = Path(__file__).resolve().parents[2]


def write_text(path: Path, text: str) -> str:
    path.write_bytes(text.encode("utf-8"))
    return str(path)


def write_tfrecord(path: Path, payloads: list[bytes]) -> str:
    tf = pytest.importorskip("tensorflow")
    with tf.io.TFRecordWriter(str(path)) as writer:
        for payload in payloads:
            writer.write(payload)
    return str(path)


def example_payloads(count: int) -> list[bytes]:
    tf = pytest.importorskip("tensorflow")
    payloads = []
    for i in range(count):
        feature = {
            "x": tf.train.Feature(float_list=tf.train.FloatList(value=[i * 0.5, -i])),
            "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 3])),
        }
        example = tf.train.Example(features=tf.train.Features(feature=feature))
        payloads.append(example.SerializeToString())
    return payloads


# --- counting -------------------------------------------------------------


def test_csv_count_excludes_header_line(tmp_path):
    path = write_text(tmp_path / "a.csv", "f1,f2,label\n1,2,0\n3,4,1\n5,6,0\n")
    [source] = resolve_sources(path)
    assert source == SourceInfo(uri=path, format="csv", num_records=3)


def test_csv_count_without_header_counts_every_line(tmp_path):
    path = write_text(tmp_path / "a.csv", "1,2,0\n3,4,1\n5,6,0\n")
    [source] = resolve_sources(path, csv_header=False)
    assert source.num_records == 3


def test_csv_count_ignores_blank_lines_crlf_and_missing_final_newline(tmp_path):
    path = write_text(tmp_path / "a.csv", "a,b\r\n\r\n1,2\r\n\n3,4\r\n\n\n5,6")
    [source] = resolve_sources(path)
    assert source.num_records == 3


def test_csv_count_with_quoted_fields_containing_commas(tmp_path):
    path = write_text(tmp_path / "a.csv", 'name,score\n"Smith, J",1\n"Doe, ""A""",2\n')
    [source] = resolve_sources(path)
    assert source.num_records == 2


def test_txt_extension_is_read_as_csv(tmp_path):
    path = write_text(tmp_path / "a.TXT", "1,2\n3,4\n")
    [source] = resolve_sources(path, csv_header=False)
    assert (source.format, source.num_records) == ("csv", 2)


def test_glob_expands_to_sorted_files_each_counted(tmp_path):
    for name, rows in [("part-2.csv", 1), ("part-0.csv", 3), ("part-1.csv", 2)]:
        write_text(tmp_path / name, "a,b\n" + "1,2\n" * rows)
    write_text(tmp_path / "other.csv", "a,b\n1,2\n")
    sources = resolve_sources(str(tmp_path / "part-*.csv"))
    assert [os.path.basename(s.uri) for s in sources] == [
        "part-0.csv",
        "part-1.csv",
        "part-2.csv",
    ]
    assert [s.num_records for s in sources] == [3, 2, 1]


def test_list_keeps_given_order_and_drops_duplicates(tmp_path):
    b = write_text(tmp_path / "b.csv", "a\n1\n")
    a = write_text(tmp_path / "a.csv", "a\n1\n2\n")
    sources = resolve_sources([b, str(tmp_path / "*.csv"), a])
    assert [s.uri for s in sources] == [b, a]


def test_relative_paths_become_absolute_uris(tmp_path, monkeypatch):
    write_text(tmp_path / "a.csv", "a\n1\n")
    monkeypatch.chdir(tmp_path)
    [source] = resolve_sources("a.csv")
    assert source.uri == str(tmp_path / "a.csv")


def test_tfrecord_count_matches_tensorflow(tmp_path):
    tf = pytest.importorskip("tensorflow")
    path = write_tfrecord(tmp_path / "data.tfrecord", example_payloads(37))
    [source] = resolve_sources(path)
    tf_count = sum(1 for _ in tf.data.TFRecordDataset(path))
    assert (source.format, source.num_records) == ("tfrecord", tf_count)
    assert tf_count == 37


@pytest.mark.parametrize("extension", [".tfrecords", ".rec"])
def test_other_tfrecord_extensions_are_detected(tmp_path, extension):
    path = write_tfrecord(tmp_path / f"data{extension}", [b"one", b"", b"three"])
    [source] = resolve_sources(path)
    assert (source.format, source.num_records) == ("tfrecord", 3)


def test_explicit_data_format_overrides_extension(tmp_path):
    path = write_text(tmp_path / "data.log", "1,2\n3,4\n")
    [source] = resolve_sources(path, data_format="csv", csv_header=False)
    assert (source.format, source.num_records) == ("csv", 2)


def test_npy_directory_counts_first_dimension(tmp_path):
    directory = tmp_path / "staged"
    directory.mkdir()
    np.save(directory / "x.npy", np.zeros((7, 3), dtype=np.float32))
    np.save(directory / "y.npy", np.zeros(7, dtype=np.int64))
    [source] = resolve_sources(str(directory))
    assert (source.format, source.num_records) == ("npy", 7)


def test_npy_directory_with_dict_features_and_no_labels(tmp_path):
    directory = tmp_path / "staged"
    directory.mkdir()
    np.save(directory / "x.age.npy", np.arange(5))
    np.save(directory / "x.pixels.npy", np.zeros((5, 2, 2)))
    [source] = resolve_sources(str(directory))
    assert (source.format, source.num_records) == ("npy", 5)


def test_source_info_round_trips_through_json():
    source = SourceInfo(uri="/data/a.csv", format="csv", num_records=12)
    assert SourceInfo.from_dict(json.loads(json.dumps(source.to_dict()))) == source


def test_source_info_rejects_unknown_format():
    with pytest.raises(DataError, match="unknown format 'parquet'"):
        SourceInfo(uri="/data/a.parquet", format="parquet", num_records=1)


def test_counting_a_million_csv_lines(tmp_path):
    # How fast this is belongs to a benchmark; here only that the count is exact.
    path = tmp_path / "big.csv"
    row = b"0.12345,1.5,-2.25,3,label\n"
    path.write_bytes(b"a,b,c,d,e\n" + row * 1_000_000)
    [source] = resolve_sources(str(path))
    assert source.num_records == 1_000_000


def test_importing_the_data_package_does_not_import_tensorflow():
    # The master imports elasticdl_nb.data and must start without TensorFlow.
    code = "import sys, elasticdl_nb.data; print('tensorflow' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert result.stdout.strip() == "False"


# --- errors ---------------------------------------------------------------


def test_missing_path_error_names_path_cwd_and_job_machine(tmp_path):
    missing = str(tmp_path / "nope.csv")
    with pytest.raises(DataError) as caught:
        resolve_sources(missing)
    message = str(caught.value)
    assert missing in message
    assert "does not exist" in message
    assert os.getcwd() in message
    assert "machine running the job" in message
    assert "absolute path" in message


def test_glob_matching_nothing_error_says_glob(tmp_path):
    pattern = str(tmp_path / "part-*.csv")
    with pytest.raises(DataError, match="no file matches this glob") as caught:
        resolve_sources(pattern)
    assert pattern in str(caught.value)


def test_one_missing_entry_in_a_list_fails_the_whole_resolution(tmp_path):
    good = write_text(tmp_path / "a.csv", "a\n1\n")
    with pytest.raises(DataError, match="missing.csv"):
        resolve_sources([good, str(tmp_path / "missing.csv")])


def test_empty_data_list_is_an_error():
    with pytest.raises(DataError, match="empty list"):
        resolve_sources([])


def test_a_url_of_a_protocol_without_a_driver_names_the_driver_to_install():
    with pytest.raises(DataError, match="no usable driver for the 'nosuchstore' protocol"):
        resolve_sources("nosuchstore://bucket/data.csv")


def test_unknown_extension_error_names_data_format_option(tmp_path):
    path = write_text(tmp_path / "data.parquet", "whatever")
    with pytest.raises(DataError) as caught:
        resolve_sources(path)
    message = str(caught.value)
    assert path in message and ".parquet" in message
    assert "data_format=" in message
    for allowed in ("'csv'", "'tfrecord'", "'npy'"):
        assert allowed in message


def test_unsupported_data_format_value_is_rejected(tmp_path):
    path = write_text(tmp_path / "a.csv", "a\n1\n")
    with pytest.raises(DataError, match="data_format='json' is not supported"):
        resolve_sources(path, data_format="json")


def test_plain_directory_error_suggests_a_glob(tmp_path):
    write_text(tmp_path / "a.csv", "a\n1\n")
    with pytest.raises(DataError, match=r"pass a glob") as caught:
        resolve_sources(str(tmp_path))
    assert os.path.join(str(tmp_path), "*.csv") in str(caught.value)


def test_empty_csv_file_error_says_remove_it(tmp_path):
    path = write_text(tmp_path / "a.csv", "")
    with pytest.raises(DataError) as caught:
        resolve_sources(path)
    message = str(caught.value)
    assert path in message and "0 records" in message and "remove it" in message


def test_header_only_csv_error_suggests_csv_header_false(tmp_path):
    path = write_text(tmp_path / "a.csv", "1,2,3\n")
    with pytest.raises(DataError) as caught:
        resolve_sources(path)
    message = str(caught.value)
    assert "only a header line" in message and "csv_header=False" in message


def test_empty_tfrecord_file_is_an_error(tmp_path):
    path = tmp_path / "a.tfrecord"
    path.write_bytes(b"")
    with pytest.raises(DataError, match="0 records"):
        resolve_sources(str(path))


def test_truncated_tfrecord_error_names_cause_and_fix(tmp_path):
    path = write_tfrecord(tmp_path / "a.tfrecord", example_payloads(5))
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[:-7])  # Cut into the last record.
    with pytest.raises(DataError) as caught:
        resolve_sources(path)
    message = str(caught.value)
    assert path in message and "truncated" in message and "regenerate" in message


def test_trailing_partial_header_in_tfrecord_is_detected(tmp_path):
    path = write_tfrecord(tmp_path / "a.tfrecord", example_payloads(2))
    with open(path, "ab") as file:
        file.write(b"\x05\x00\x00")
    with pytest.raises(DataError, match="3 bytes remain after the last whole record"):
        resolve_sources(path)


def test_non_tfrecord_file_with_tfrecord_extension_is_detected(tmp_path):
    path = write_text(tmp_path / "a.tfrecord", "a,b,c\n1,2,3\n4,5,6\n")
    with pytest.raises(DataError, match="not a TFRecord file"):
        resolve_sources(path)


def test_gzipped_tfrecord_error_says_decompress(tmp_path):
    import gzip

    raw = Path(write_tfrecord(tmp_path / "raw.tfrecord", example_payloads(3))).read_bytes()
    path = tmp_path / "a.tfrecord"
    path.write_bytes(gzip.compress(raw))
    with pytest.raises(DataError, match="GZIP-compressed.*decompress"):
        resolve_sources(str(path))


def test_npy_arrays_of_different_lengths_error_names_both(tmp_path):
    directory = tmp_path / "staged"
    directory.mkdir()
    np.save(directory / "x.npy", np.zeros((10, 2)))
    np.save(directory / "y.npy", np.zeros(9))
    with pytest.raises(DataError) as caught:
        resolve_sources(str(directory))
    message = str(caught.value)
    assert "x.npy has 10 records" in message and "y.npy has 9" in message
    assert "re-stage" in message


def test_npy_dict_features_of_different_lengths_error_names_both(tmp_path):
    directory = tmp_path / "staged"
    directory.mkdir()
    np.save(directory / "x.a.npy", np.zeros(4))
    np.save(directory / "x.b.npy", np.zeros(6))
    with pytest.raises(DataError, match="x.a.npy has 4 records but x.b.npy has 6"):
        resolve_sources(str(directory))


def test_npy_directory_with_both_plain_and_dict_features_is_ambiguous(tmp_path):
    directory = tmp_path / "staged"
    directory.mkdir()
    np.save(directory / "x.npy", np.zeros(4))
    np.save(directory / "x.a.npy", np.zeros(4))
    with pytest.raises(DataError, match="ambiguous"):
        resolve_sources(str(directory))


def test_npy_format_on_a_file_asks_for_a_staged_directory(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.zeros(3))
    with pytest.raises(DataError, match="expects a staged-array directory"):
        resolve_sources(str(path), data_format="npy")


def test_staged_directory_is_resolved_as_npy(tmp_path):
    directory = stage_arrays(np.ones((6, 2)), np.zeros(6), str(tmp_path / "staged"))
    assert resolve_sources(directory) == [SourceInfo(uri=directory, format="npy", num_records=6)]


@pytest.mark.parametrize("chunk_bytes", [1, 2, 3, 7, 64])
def test_line_offsets_do_not_depend_on_where_chunks_end(tmp_path, monkeypatch, chunk_bytes):
    from elasticdl_nb.data import csv_lines

    text = b"h1,h2\r\n1,2\n\n33,4\r\n\r\n5,666\n7,8"
    path = tmp_path / "mixed.csv"
    path.write_bytes(text)
    expected = [0, 7, 12, 20, 26]  # every non-empty line, the unterminated last one too
    monkeypatch.setattr(csv_lines, "_CHUNK_BYTES", chunk_bytes)
    assert csv_lines.nonempty_line_starts(str(path)).tolist() == expected
    assert csv_lines.count_nonempty_lines(str(path)) == len(expected)
