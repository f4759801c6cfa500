"""What an embedding table is, as the workers and the PS agree on it, and how its rows start.

Tables live on the PS only (issue 17): a PS holds a row once a gradient has reached it,
and a row nobody has trained reads as its *initial row*. That row must be the same on
every pull until it is stored (a worker computes its gradient at the value it pulled, the
PS applies it to the value it holds), on every PS incarnation and in every job that asks,
so it is a pure function of (table seed, id, column): a counter-based generator
(splitmix64), vectorised with numpy, with no state to checkpoint.

`Initializer` is the distribution of a row in plain numbers (the worker translates the
layer's Keras initializer into one, where Keras is at hand); `initial_rows` draws from it.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import asdict, dataclass, field

import numpy as np

KINDS = ("uniform", "normal", "truncated_normal", "constant")
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@dataclass(frozen=True)
class Initializer:
    """A row's distribution: `uniform` on [low, high), `normal` and `truncated_normal`
    (cut at two standard deviations, as Keras's is) with `mean` and `stddev`, or
    `constant` (every entry `value`)."""

    kind: str = "uniform"
    low: float = -0.05
    high: float = 0.05
    mean: float = 0.0
    stddev: float = 1.0
    value: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"initializer kind {self.kind!r} is not one of {KINDS}")


@dataclass(frozen=True)
class TableDef:
    """An embedding table: `dim` columns of `dtype`; ids in [0, input_dim), or any int64
    when `input_dim` is 0; rows start as `initializer` draws them with `seed`.

    What it keeps (0 = no limit): an id gets a trained row once it has been seen in
    `min_count` minibatches; at most `max_rows` rows across the PS, least recently updated
    ones evicted first; rows not updated for `ttl_steps` model versions (of their PS) are
    evicted. An evicted id that comes back starts from its initial row again."""

    name: str
    dim: int
    dtype: str = "float32"
    input_dim: int = 0
    initializer: Initializer = field(default_factory=Initializer)
    seed: int = 0
    min_count: int = 0
    max_rows: int = 0
    ttl_steps: int = 0

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TableDef:
        data = json.loads(text)
        return cls(**{**data, "initializer": Initializer(**data["initializer"])})

    @staticmethod
    def seed_for(name: str, initializer_seed: int | None = None) -> int:
        """A table's seed: its name's, so two tables of a model start differently, mixed
        with the seed the layer's initializer was given, if any."""
        return zlib.crc32(name.encode()) ^ ((initializer_seed or 0) & 0xFFFFFFFF) << 32


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer (uint64 in, uint64 out; wrapping arithmetic)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _uniform(seed: int, ids: np.ndarray, dim: int, stream: int) -> np.ndarray:
    """[len(ids), dim] floats in [0, 1), one independent draw per (seed, id, column, stream)."""
    with np.errstate(over="ignore"):
        key = _mix(np.asarray(ids, np.int64).view(np.uint64) ^ np.uint64(seed & (2**64 - 1)))
        counters = (np.arange(dim, dtype=np.uint64) + np.uint64(stream * dim + 1)) * _GOLDEN
        z = _mix(key[:, None] + counters[None, :])
    return (z >> np.uint64(11)).astype(np.float64) * 2.0**-53


def _standard_normal(seed: int, ids: np.ndarray, dim: int, stream: int) -> np.ndarray:
    u1 = _uniform(seed, ids, dim, 2 * stream)
    u2 = _uniform(seed, ids, dim, 2 * stream + 1)
    return np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2.0 * np.pi * u2)


CHUNK = 1 << 16  # ids drawn at a time: the float64 temporaries stay tens of MB


def initial_rows(table: TableDef, ids: np.ndarray) -> np.ndarray:
    """The rows `ids` start as: [len(ids), dim] of the table's dtype."""
    ids = np.asarray(ids, np.int64)
    if len(ids) <= CHUNK:
        return _draw(table, ids)
    out = np.empty((len(ids), table.dim), table.dtype)
    for start in range(0, len(ids), CHUNK):
        out[start : start + CHUNK] = _draw(table, ids[start : start + CHUNK])
    return out


def _draw(table: TableDef, ids: np.ndarray) -> np.ndarray:
    init, dim, seed = table.initializer, table.dim, table.seed
    if init.kind == "constant":
        rows = np.full((len(ids), dim), init.value)
    elif init.kind == "uniform":
        rows = init.low + (init.high - init.low) * _uniform(seed, ids, dim, 0)
    else:
        z = _standard_normal(seed, ids, dim, 0)
        if init.kind == "truncated_normal":  # redraw what falls outside two deviations
            for stream in range(1, 16):
                outside = np.abs(z) > 2.0
                if not outside.any():
                    break
                z = np.where(outside, _standard_normal(seed, ids, dim, stream), z)
            z = np.clip(z, -2.0, 2.0)  # (after 15 redraws: probability 0.046^15)
        rows = init.mean + init.stddev * z
    return rows.astype(table.dtype)
