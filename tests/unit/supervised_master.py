"""A stand-in master for the supervisor's tests, run by a real supervisor in place of
the master process (`--master-module tests.unit.supervised_master`).

Each incarnation follows the steps that `plan.json` in the job directory gives it (by
incarnation number, else "default"), talking to the supervisor through the real
launcher (`SupervisedProcesses`), and writes what it did and heard to `seen.jsonl`:

    ["serve"]                      write master.json, as a master that serves does
    ["launch", role, id]           ["kill", role, id, force]       ["adopt"]
    ["wait_end", role, id]         until the instance's end event has come
    ["wait_started", role, id]     until its started event has come
    ["shutdown", grace]            ["state", state]  write state.json (the job is over)
    ["on_sigterm", grace]          SIGTERM: shut the instances down, record 'stopped', exit
    ["hang"]                       ["exit", code]                  ["sigkill"] (itself)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
from dataclasses import asdict
from pathlib import Path

from elasticdl_nb.backends.local.supervisor_protocol import INCARNATION_ENV, SUPERVISOR_PID_ENV
from elasticdl_nb.runtime.job_dir import JobDir, write_json
from elasticdl_nb.runtime.lifeline import die_with_parent

# Where the workers and PS it launches look for a master: nobody serves there, so they
# wait (calling it for minutes) until they are killed.
NOWHERE = "unix-abstract:elasticdl-nb-test-nobody"


class StandIn:
    def __init__(self, job_dir: Path):
        self.files = JobDir(job_dir)
        self.incarnation = int(os.environ[INCARNATION_ENV])
        self._seen = open(job_dir / "seen.jsonl", "a")
        self._lock = threading.Condition()
        self._heard: set[tuple[str, int, bool]] = set()  # (role, id, ended)
        self._launcher = None

    def note(self, **fields) -> None:
        with self._lock:
            self._seen.write(json.dumps({"incarnation": self.incarnation, **fields}) + "\n")
            self._seen.flush()

    def on_event(self, event) -> None:
        self.note(event=asdict(event))
        with self._lock:
            self._heard.add((event.role, event.instance_id, event.ended))
            self._lock.notify_all()

    @property
    def launcher(self):
        if self._launcher is None:  # (gRPC is imported only by the plans that need it)
            from elasticdl_nb.backends.local.supervised import SupervisedProcesses
            from elasticdl_nb.runtime.process_env import ProcessEnv

            env = ProcessEnv("test-token", self.files.path, NOWHERE, ()).to_environ()
            self._launcher = SupervisedProcesses(env, self.on_event)
        return self._launcher

    def run(self, steps: list[list]) -> None:
        for op, *args in steps:
            self.note(step=[op, *args])
            if op == "serve":
                supervisor = int(os.environ[SUPERVISOR_PID_ENV])
                master = {"address": NOWHERE, "pid": os.getpid(), "supervisor_pid": supervisor}
                write_json(self.files.master, master)
            elif op == "launch":
                try:
                    self.launcher.launch(args[0], args[1])
                except Exception as exc:
                    self.note(error=str(exc))
            elif op == "kill":
                self.launcher.kill(*args)
            elif op == "adopt":
                self.note(adopted=sorted(self.launcher.adopt()))
            elif op in ("wait_end", "wait_started"):
                heard = (*args, op == "wait_end")
                with self._lock:
                    self._lock.wait_for(lambda heard=heard: heard in self._heard, timeout=60)
            elif op == "shutdown":
                self.launcher.shutdown(args[0])
                self.note(shutdown_done=True)
            elif op == "state":
                write_json(self.files.state, {"name": "test", "state": args[0]})
            elif op == "on_sigterm":
                signal.signal(signal.SIGTERM, lambda *_, grace=args[0]: self._stop(grace))
            elif op == "hang":
                while True:
                    time.sleep(0.1)
            elif op == "exit":
                os._exit(args[0])
            elif op == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)

    def _stop(self, grace: float) -> None:
        self.launcher.shutdown(grace)
        self.note(stopped=True)
        write_json(self.files.state, {"name": "test", "state": "stopped"})
        os._exit(0)


def main() -> None:
    die_with_parent()  # as the master process does first
    parser = argparse.ArgumentParser()
    parser.add_argument("--job-dir", required=True, type=Path)
    job_dir = parser.parse_args().job_dir
    stand_in = StandIn(job_dir)
    print(f"stand-in master, incarnation {stand_in.incarnation}", flush=True)
    plans = json.loads((job_dir / "plan.json").read_text())
    stand_in.run(plans.get(str(stand_in.incarnation), plans.get("default", [])))


if __name__ == "__main__":
    main()
