"""Remote data (s3:// URLs through fsspec) against a real S3-compatible server on loopback:
globbing, counting, record ranges of CSV and TFRecord, and the errors a user can fix."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from elasticdl_nb.data import DataError, SourceInfo, csv_lines, open_reader, resolve_sources
from elasticdl_nb.data.remote_files import ObjectStore
from elasticdl_nb.data.sparse_index import SparseIndex, checkpoints_per_source

# Blank lines, CRLF endings and no final newline: what the local reader handles, the
# remote one must count and cut the same way.
AWKWARD_CSV = b"\xef\xbb\xbfa,b,label\r\n1,2,0\r\n\r\n3,4,1\n\n5,6,0\n7,8,1"


@pytest.fixture
def s3(s3_server, monkeypatch):
    s3_server.use(monkeypatch)
    return s3_server


def big_csv(lines: int) -> bytes:
    rows = [f"{i},{i * 0.25},{i % 2}" for i in range(lines)]
    return ("x,y,label\n" + "\n".join(rows) + "\n").encode()


def tfrecord_bytes(tmp_path, count: int) -> tuple[bytes, list[bytes]]:
    import tensorflow as tf

    path = str(tmp_path / "data.tfrecord")
    payloads = []
    with tf.io.TFRecordWriter(path) as writer:
        for i in range(count):
            feature = {"x": tf.train.Feature(float_list=tf.train.FloatList(value=[1.0] * (i % 7)))}
            payload = tf.train.Example(
                features=tf.train.Features(feature=feature)
            ).SerializeToString()
            payloads.append(payload)
            writer.write(payload)
    return (tmp_path / "data.tfrecord").read_bytes(), payloads


# --- globbing and counting ----------------------------------------------------------


def test_a_glob_expands_to_the_sorted_matching_objects_with_their_counts(s3):
    prefix = s3.new_prefix()
    for i, lines in ((2, 3), (0, 5), (1, 1)):
        s3.put(f"{prefix}/train-{i}.csv", big_csv(lines))
    s3.put(f"{prefix}/notes.txt", b"a\n1\n")
    s3.put(f"{prefix}/nested/train-9.csv", big_csv(4))
    sources = resolve_sources(f"{prefix}/train-*.csv")
    assert [(s.uri, s.num_records) for s in sources] == [
        (f"{prefix}/train-0.csv", 5),
        (f"{prefix}/train-1.csv", 1),
        (f"{prefix}/train-2.csv", 3),
    ]
    assert all(s.format == "csv" and s.index is not None for s in sources)
    assert [s.uri for s in resolve_sources(f"{prefix}/**/train-9.csv")] == [
        f"{prefix}/nested/train-9.csv"
    ]


def test_remote_csv_counts_and_rows_equal_the_same_file_read_locally(s3, tmp_path):
    url = s3.put(f"{s3.new_prefix()}/awkward.csv", AWKWARD_CSV)
    local = tmp_path / "awkward.csv"
    local.write_bytes(AWKWARD_CSV)
    for header in (True, False):
        [remote_source] = resolve_sources(url, csv_header=header)
        [local_source] = resolve_sources(str(local), csv_header=header)
        assert remote_source.num_records == local_source.num_records == 4 + (not header)
        remote = open_reader(remote_source, csv_header=header)
        here = open_reader(local_source, csv_header=header)
        assert remote.column_names == here.column_names
        n = local_source.num_records
        for start in range(n):
            for end in range(start, n + 1):
                assert remote.read(start, end).tolist() == here.read(start, end).tolist()


def test_a_task_of_a_large_remote_csv_fetches_its_own_bytes_not_the_object(s3, monkeypatch):
    data = big_csv(100_000)
    url = s3.put(f"{s3.new_prefix()}/big.csv", data)
    [source] = resolve_sources(url)
    assert source.num_records == 100_000
    assert len(source.index.offsets) <= 256  # the list travels in a ConfigMap
    fetched = []
    original = ObjectStore.read

    def counting_read(self, url, start, stop):
        fetched.append(stop - start)
        return original(self, url, start, stop)

    monkeypatch.setattr(ObjectStore, "read", counting_read)
    reader = open_reader(source)
    rows = reader.read(61_234, 62_234)
    assert rows[:, 0].tolist() == [str(i) for i in range(61_234, 62_234)]
    assert rows[-1].tolist() == ["62233", str(62_233 * 0.25), "1"]
    assert 0 < sum(fetched) < len(data) // 10


def test_remote_tfrecord_counts_and_ranges_equal_the_written_records(s3, tmp_path):
    data, payloads = tfrecord_bytes(tmp_path, 20_000)  # enough for a thinned index
    url = s3.put(f"{s3.new_prefix()}/train.tfrecord", data)
    [source] = resolve_sources(url)
    assert (source.format, source.num_records) == ("tfrecord", 20_000)
    assert source.index.stride > 64 and len(source.index.offsets) <= 256
    reader = open_reader(source)
    rng = random.Random(7)
    ranges = [(0, 1), (0, 20_000), (19_999, 20_000), (128, 129)]
    ranges += [tuple(sorted(rng.sample(range(20_001), 2))) for _ in range(20)]
    for start, end in ranges:
        assert reader.read(start, end).tolist() == payloads[start:end]


def test_the_source_list_with_its_index_survives_the_trip_to_the_workers(s3):
    url = s3.put(f"{s3.new_prefix()}/a.csv", big_csv(50))
    [source] = resolve_sources(url)
    travelled = SourceInfo.from_dict(json.loads(json.dumps(source.to_dict())))
    assert travelled == source
    assert open_reader(travelled).read(10, 12).tolist() == [["10", "2.5", "0"], ["11", "2.75", "1"]]


def test_streamed_chunks_index_the_same_lines_as_the_memory_mapped_file(tmp_path):
    rng = random.Random(3)
    pieces = [b"", b"\n", b"\r\n", b"ab", b"\r", b"x,y\n", b"1\r\n"]
    data = b"".join(rng.choice(pieces) for _ in range(3000))
    path = tmp_path / "lines.csv"
    path.write_bytes(data)
    every = csv_lines.nonempty_line_starts(str(path))
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(data)), 40))
        chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
        count, offsets = csv_lines.sparse_line_starts(chunks, 5)
        assert count == len(every)
        assert offsets.tolist() == every[::5].tolist()


# --- errors before launch -----------------------------------------------------------


def test_a_missing_bucket_is_named_with_the_fix(s3):
    for url in ("s3://no-such-bucket/train-*.csv", "s3://no-such-bucket/train.csv"):
        with pytest.raises(DataError, match="bucket 'no-such-bucket' does not exist") as caught:
            resolve_sources(url)
        assert "AWS_ENDPOINT_URL" in str(caught.value)


def test_missing_objects_are_named(s3):
    prefix = s3.new_prefix()
    s3.put(f"{prefix}/train-0.csv", big_csv(2))
    with pytest.raises(DataError, match="no object matches this glob"):
        resolve_sources(f"{prefix}/eval-*.csv")
    with pytest.raises(DataError, match="this object does not exist"):
        resolve_sources([f"{prefix}/train-0.csv", f"{prefix}/train-1.csv"])


@pytest.mark.parametrize("wrong", ["key", "secret"])
def test_refused_credentials_say_which_variables_to_set(s3_server, monkeypatch, wrong):
    url = s3_server.put(f"{s3_server.new_prefix()}/a.csv", big_csv(2))
    if wrong == "key":
        s3_server.use(monkeypatch, key_id="AKIANOSUCHKEY0000000", secret="whatever")
    else:
        s3_server.use(monkeypatch, secret="not-the-secret")
    for data in (url, url.replace("a.csv", "*.csv")):
        with pytest.raises(DataError, match="refused the credentials") as caught:
            resolve_sources(data)
        message = str(caught.value)
        assert "AWS_ACCESS_KEY_ID" in message and "AWS_SECRET_ACCESS_KEY" in message


def test_fixed_credentials_work_on_the_next_try_in_the_same_process(s3_server, monkeypatch):
    url = s3_server.put(f"{s3_server.new_prefix()}/a.csv", big_csv(2))
    s3_server.use(monkeypatch, secret="not-the-secret")
    with pytest.raises(DataError, match="refused the credentials"):
        resolve_sources(url)
    s3_server.use(monkeypatch)
    assert resolve_sources(url)[0].num_records == 2


def test_remote_sources_that_cannot_be_used_say_why(s3, tmp_path):
    prefix = s3.new_prefix()
    s3.put(f"{prefix}/header-only.csv", b"a,b\n")
    s3.put(f"{prefix}/folder/a.csv", big_csv(2))
    s3.put(f"{prefix}/broken.tfrecord", b"\x05\x00\x00")
    with pytest.raises(DataError, match="only a header line"):
        resolve_sources(f"{prefix}/header-only.csv")
    with pytest.raises(DataError, match="is a directory"):
        resolve_sources(f"{prefix}/folder")
    with pytest.raises(DataError, match="truncated or not a TFRecord"):
        resolve_sources(f"{prefix}/broken.tfrecord")
    with pytest.raises(DataError, match="memory-mapping a local directory"):
        resolve_sources(f"{prefix}/folder/a.csv", data_format="npy")


@pytest.mark.parametrize("new_size", ["same size", "other size"])
def test_an_object_overwritten_during_the_job_is_refused_not_misread(s3, new_size):
    data = big_csv(10)
    url = s3.put(f"{s3.new_prefix()}/a.csv", data)
    [source] = resolve_sources(url)
    s3.put(url, data.replace(b"1,0.25", b"7,0.75") if new_size == "same size" else big_csv(12))
    with pytest.raises(DataError, match="changed while the job was running"):
        open_reader(source).read(0, 5)


def test_file_urls_are_local_paths(tmp_path):
    path = tmp_path / "a.csv"
    path.write_bytes(big_csv(3))
    [source] = resolve_sources(f"file://{path}")
    assert (source.uri, source.num_records, source.index) == (str(path), 3, None)
    assert np.asarray(open_reader(source).read(0, 3)).shape == (3, 3)


@pytest.mark.parametrize("sources", [1, 100, 2000])
def test_the_indexes_of_a_jobs_sources_fit_the_configmap_together(sources):
    # Offsets of a 10 GB object are 11 digits each; a ConfigMap holds 1 MiB in all.
    keep = checkpoints_per_source(sources)
    index = SparseIndex(stride=64, offsets=tuple(range(10**10, 10**10 + keep)), units=1, size=1)
    assert len(json.dumps(index.to_dict())) * sources < 512 * 1024
    assert keep >= 8
