"""ElasticDL's custom_data_reader contract (model/custom_data_reader.py): its params, its
shards as sources, the checks that name what a reader gets wrong, and the records of a
range read through it."""

from __future__ import annotations

import pytest

from elasticdl_nb.data import DataError, SourceInfo
from elasticdl_nb.model.contract import ContractError, Mode, ModelContract
from elasticdl_nb.model.custom_data_reader import (
    CustomRecords,
    custom_sources,
    data_origin,
    reader_params,
)


class Reader:
    """A reader of `n` numbered records per shard; shard 'b' starts at record 100."""

    records_output_types = "int64"

    def __init__(self, data_origin, records_per_task=None, extra=0, shards=None):
        self.origin, self.extra = data_origin, extra
        self.shards = shards if shards is not None else {"a": (0, 5), "b": (100, 3)}

    def create_shards(self):
        return self.shards

    def read_records(self, task):
        yield from range(task.start, task.end + self.extra)


def test_params_are_literals_or_text():
    assert reader_params(" sep='|'; shard=300;name=table_1 ;") == {
        "sep": "|",
        "shard": 300,
        "name": "table_1",
    }
    with pytest.raises(ContractError, match="is not key=value"):
        reader_params("shard")


def test_shards_become_sources_that_remember_their_first_record():
    sources = custom_sources(Reader, "data", "/d", 64, {})
    assert [s.to_dict() for s in sources] == [
        {"uri": "a", "format": "custom", "num_records": 5, "origin": "/d", "offset": 0},
        {"uri": "b", "format": "custom", "num_records": 3, "origin": "/d", "offset": 100},
    ]
    assert SourceInfo.from_dict(sources[1].to_dict()) == sources[1]


def test_what_a_reader_gets_wrong_is_said():
    with pytest.raises(DataError, match="not empty"):
        custom_sources(Reader, "data", "/d", 64, {"shards": {}})
    with pytest.raises(DataError, match=r"shard 'a' .* is 5, not \(first record, records\)"):
        custom_sources(Reader, "data", "/d", 64, {"shards": {"a": 5}})
    with pytest.raises(ContractError, match="failed: .*unexpected keyword argument 'sep'"):
        custom_sources(Reader, "data", "/d", 64, {"sep": "|"})
    with pytest.raises(ContractError, match="lacks create_shards, read_records"):
        custom_sources(lambda data_origin, **kw: object(), "data", "/d", 64, {})
    with pytest.raises(ContractError, match="gives 2 data origins"):
        data_origin("data", ["/a", "/b"])


def test_a_range_is_read_at_the_shard_s_offset_and_must_be_whole():
    contract = ModelContract(lambda: None, lambda a, b: None, lambda: None)
    contract.custom_data_reader = Reader
    source = custom_sources(Reader, "data", "/d", 64, {})[1]
    records = CustomRecords(contract, "/d", {}).dataset(source, 1, 3, Mode.TRAINING)
    assert [int(r) for r in records] == [101, 102]
    too_many = CustomRecords(contract, "/d", {"extra": 1}).dataset(source, 1, 3, Mode.TRAINING)
    with pytest.raises(Exception, match=r"gave more than 2 records for \[101, 103\) of shard 'b'"):
        list(too_many)
