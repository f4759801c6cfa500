"""Input data for elastic jobs: find and count sources, read record ranges, stage arrays.

The master uses `resolve_sources` to count records and cut tasks; workers use
`open_reader(source).read(start, end)` to get a task's records as NumPy
structures. Sources are local paths or object-store URLs (s3://bucket/part-*.csv,
any fsspec protocol; see `remote_files`). Nothing in this package imports
TensorFlow (nor fsspec until a remote URL is used), so the master can import it
and start quickly.
"""

from elasticdl_nb.data.csv_decoding import default_decode_csv, default_decode_csv_features
from elasticdl_nb.data.errors import DataError
from elasticdl_nb.data.readers import RecordReader, open_reader
from elasticdl_nb.data.sources import SourceInfo, resolve_sources
from elasticdl_nb.data.staging import stage_arrays

__all__ = [
    "DataError",
    "RecordReader",
    "SourceInfo",
    "default_decode_csv",
    "default_decode_csv_features",
    "open_reader",
    "resolve_sources",
    "stage_arrays",
]
