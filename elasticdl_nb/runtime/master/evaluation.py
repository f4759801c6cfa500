"""Evaluation rounds: the validation data cut into tasks, the workers' metric states
summed per round, and the merged metrics journaled once every task of a round is in.

Merging metric states into values needs the model's metric objects, which imports
TensorFlow the first time (seconds): that runs on an evaluator thread of its own, so
the coordinator is never held up by it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from elasticdl_nb.runtime.master.strategy import JobControl
from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from elasticdl_nb.runtime.protocol.tensors import to_array
from elasticdl_nb.vocabulary import EventKind

log = logging.getLogger("elasticdl_nb.master")


class EvalRound:
    """One evaluation of the model as it was at `step`: its metric states, summed."""

    def __init__(self, step: int, tasks: int, final: bool, epoch: int | None = None):
        self.step, self.tasks_left, self.final = step, tasks, final
        self.epoch = epoch  # the epoch whose end waits for this round (callbacks), if any
        self.states: dict[str, list[np.ndarray]] = {}
        self.publishing = False

    def add(self, states: dict[str, list[np.ndarray]]) -> None:
        for name, variables in states.items():
            values = [np.asarray(v, dtype=np.float64) for v in variables]
            have = self.states.get(name)
            self.states[name] = values if have is None else [a + b for a, b in zip(have, values)]
        self.tasks_left -= 1


def metric_states(states: list[pb.MetricState]) -> dict[str, list[np.ndarray]]:
    """A worker's metric states as arrays, by metric name."""
    return {s.name: [to_array(t) for t in s.variables] for s in states}


class Evaluations:
    """The job's evaluation rounds in progress and the newest metrics. Guarded by the
    master's lock (`job.lock`); publishing runs on the evaluator thread."""

    STATE = ("rounds", "_counter", "final_started", "last_metrics")

    def __init__(self, job: JobControl, load_contract: Callable[[], object]):
        self._job = job
        self._load_contract = load_contract  # lazy: the master imports TF only to evaluate
        self.rounds: dict[int, EvalRound] = {}  # evaluations in progress
        self._counter = 0
        self.final_started = False
        self.last_metrics: dict = {}
        self._evaluator = ThreadPoolExecutor(1, thread_name_prefix="evaluator")
        # Called on the evaluator thread with (metrics, the epoch whose end waited for
        # the round or None), under the lock, in the transaction that journals them.
        self.on_published: Callable[[dict, int | None], None] | None = None

    def restore_state(self, state: dict) -> None:
        """A snapshot's rounds (snapshot.py): one that was being published is this
        master's to publish (its metrics were not journaled before the snapshot)."""
        for name, value in state.items():
            setattr(self, name, value)
        for eval_round in self.rounds.values():
            eval_round.publishing = False

    @property
    def open(self) -> bool:
        """Whether a round has not been published yet."""
        return bool(self.rounds)

    def start(self, step: int, final: bool, epoch: int | None = None) -> None:
        """Queue a round's tasks at the front of the queue (under the lock); `epoch`: the
        epoch whose end it judges."""
        round_id = self._counter
        tasks = self._job.queue.add_evaluation(round_id)
        at_end = {} if epoch is None else {"epoch": epoch}
        self._job.journal.append(
            EventKind.EVALUATION_STARTED,
            round=round_id,
            step=step,
            tasks=tasks,
            final=final,
            **at_end,
        )
        self._started(round_id, step, tasks, final, epoch)

    def _started(
        self, round_id: int, step: int, tasks: int, final: bool, epoch: int | None = None
    ) -> None:
        self._counter = round_id + 1
        self.final_started |= final
        self.rounds[round_id] = EvalRound(step, tasks, final, epoch)

    def add(self, round_id: int, worker: int, states: dict[str, list[np.ndarray]]) -> None:
        """An evaluation task's metric states (under the lock), journaled."""
        self._job.journal.append(
            EventKind.EVALUATION_TASK,
            round=round_id,
            worker=worker,
            states={name: [v.tolist() for v in values] for name, values in states.items()},
        )
        eval_round = self.rounds.get(round_id)
        if eval_round is not None:
            eval_round.add(states)

    def replay(self, kind: str, data: dict) -> None:
        """What an earlier master of this job journaled about evaluation (`recovery.py`)."""
        if kind == EventKind.EVALUATION_STARTED:
            self._started(
                data["round"],
                data["step"],
                data["tasks"],
                data.get("final", False),
                data.get("epoch"),
            )
        elif kind == EventKind.EVALUATION_TASK and data["round"] in self.rounds:
            self.rounds[data["round"]].add(data["states"])
        elif kind == EventKind.EVALUATION:
            self.last_metrics = {"step": data["step"], **data["metrics"]}
            self.rounds.pop(data["round"], None)

    def publish_finished(self) -> None:
        """Hand finished rounds to the evaluator thread."""
        with self._job.lock:
            for round_id, eval_round in self.rounds.items():
                if eval_round.tasks_left <= 0 and not eval_round.publishing:
                    eval_round.publishing = True
                    self._evaluator.submit(self._publish, round_id, eval_round)

    def _publish(self, round_id: int, eval_round: EvalRound) -> None:
        from elasticdl_nb.model.metrics import merged_results

        job = self._job
        try:
            metrics = merged_results(self._load_contract(), eval_round.states)
        except Exception as exc:  # a metric that cannot be merged ends the job visibly
            log.exception("evaluation round %d", round_id)
            job.fail(f"evaluation metrics could not be computed: {exc!r}")
            return
        with job.lock, job.journal.transaction():
            self.last_metrics = {"step": eval_round.step, **metrics}
            job.journal.append(
                EventKind.EVALUATION,
                round=round_id,
                step=eval_round.step,
                metrics=metrics,
                final=eval_round.final,
            )
            del self.rounds[round_id]
            if self.on_published is not None:
                self.on_published(metrics, eval_round.epoch)
            job.wake()
