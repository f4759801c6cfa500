"""When the master says it is behind its workers, and when it caught up
(runtime/master/saturation.py), from the load samples it is given (a real server's are
tests/unit/test_server_load.py's); while it is behind, no worker's silence counts."""

from __future__ import annotations

from elasticdl_nb.runtime.master.saturation import CALM_S, WAIT_S, Saturation
from elasticdl_nb.runtime.master.worker_silence import WorkerSilence
from elasticdl_nb.runtime.protocol.server_load import LoadSample


def sample(turned_away=0, wait=0.0, served=100, in_flight=10) -> LoadSample:
    return LoadSample(
        seconds=0.5, arrived=served + turned_away, turned_away=turned_away, served=served,
        longest_wait_s=wait, in_flight=in_flight, waiting=max(0, in_flight - 64),
    )  # fmt: skip


class Load:
    max_calls, threads = 256, 64

    def __init__(self):
        self.samples: list[LoadSample] = []

    def sample(self) -> LoadSample:
        return self.samples.pop(0) if self.samples else sample()


class Master:
    def __init__(self):
        self.now = 1000.0
        self.events: list[tuple[str, dict]] = []
        self.load = Load()
        self.silence = WorkerSilence(seconds=30, clock=lambda: self.now)
        self.saturation = Saturation(
            lambda kind, **data: self.events.append((kind, data)),
            self.load,
            self.silence,
            clock=lambda: self.now,
        )

    def turns(self, seconds: float, *samples: LoadSample) -> None:
        """Coordinator turns every half second for `seconds`, the load `samples` first."""
        self.load.samples.extend(samples)
        for _ in range(int(seconds / 0.5)):
            self.now += 0.5
            self.saturation.check()


def test_a_master_that_keeps_up_says_nothing():
    master = Master()
    master.turns(60, sample(wait=WAIT_S * 0.9), sample(in_flight=200))
    assert master.events == [] and not master.saturation.saturated


def test_turned_away_calls_or_a_long_wait_begin_a_spell_and_calm_ends_it():
    master = Master()
    master.turns(2)
    master.turns(1, sample(turned_away=40, in_flight=256, served=300), sample(wait=2.5))
    kinds = [kind for kind, _ in master.events]
    assert kinds == ["master_saturated"]
    first = master.events[0][1]
    assert first["turned_away"] == 40 and first["calls"] == 256 and first["max_calls"] == 256
    assert first["calls_per_s"] == 600.0
    master.turns(CALM_S - 0.5)  # calm, but not yet for CALM_S since the last busy look
    assert master.saturation.saturated
    master.turns(0.5)
    assert [kind for kind, _ in master.events] == ["master_saturated", "master_caught_up"]
    spell = master.events[1][1]
    assert spell["turned_away"] == 40 and spell["longest_wait_s"] == 2.5
    assert spell["seconds"] == CALM_S + 0.5 and spell["served"] >= 400


def test_a_long_wait_alone_is_saturation_too():
    master = Master()
    master.turns(1, sample(wait=WAIT_S))
    assert [kind for kind, _ in master.events] == ["master_saturated"]
    assert master.events[0][1]["turned_away"] == 0


def test_no_worker_is_silent_while_the_master_is_behind_nor_until_the_budget_after():
    master = Master()
    master.silence.heard(1)
    master.turns(10)
    master.turns(40, *[sample(turned_away=5)] * 80)  # 40 s behind: worker 1 says nothing
    assert master.silence.overdue({1}) == []
    while master.saturation.saturated:  # calm: it catches up after CALM_S
        master.turns(0.5)
    assert master.events[-1][0] == "master_caught_up"
    master.turns(29.5)  # silence counts from its last look behind
    assert master.silence.overdue({1}) == []
    master.turns(1)
    assert [w for w, _ in master.silence.overdue({1})] == [1]
