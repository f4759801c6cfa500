"""A worker process: `python -m elasticdl_nb.runtime.worker --id N`.

Asks the master for tasks until told the job is over. For each minibatch of a training
task: pull what the step needs from the PS, compute gradients with tf.GradientTape, push
them; evaluation tasks update the metrics; the export task saves the whole model.
A failure in the user's code is reported to the master (which fails the job) and ends the
process with exit code 3; a peer whose address is served by something else, with exit code
4 (the master fails the job with the reason); anything else exits non-zero and the master
relaunches. Calls to the master ride out a master that is briefly unreachable
(`MASTER_PATIENCE`); calls to the PS, a PS that is relaunched.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time

from elasticdl_nb.runtime.exit_codes import USER_CODE_EXIT, WRONG_PEER_EXIT
from elasticdl_nb.runtime.logs import setup_logging
from elasticdl_nb.runtime.process_env import ProcessEnv
from elasticdl_nb.runtime.protocol import elasticdl_pb2 as pb
from elasticdl_nb.runtime.protocol.patience import PeerUnreachable, WrongPeer
from elasticdl_nb.runtime.protocol.tls import WORKER
from elasticdl_nb.runtime.worker.reporter import Reporter
from elasticdl_nb.runtime.worker.task_feed import TaskRequests
from elasticdl_nb.vocabulary import Strategy

log = logging.getLogger("elasticdl_nb.worker")


def _terminated(signum: int, frame: object) -> None:
    """SIGTERM (a preemption, an eviction, a deleted pod, a job's end): leave at once.
    Nothing here needs saving (what this worker has not reported goes back to the
    queue, as after a SIGKILL), and a pod that preempts this one waits until it is gone:
    unwinding Python, gRPC and TensorFlow took 3-13 s on a pod limited to 200m CPU."""
    log.info("SIGTERM: exiting now")
    os._exit(143)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--id", type=int, required=True)
    worker_id = parser.parse_args().id
    setup_logging(f"worker-{worker_id}")
    signal.signal(signal.SIGTERM, _terminated)
    env = ProcessEnv.from_environ(WORKER)
    log.info("worker %d of job %s started (pid %d)", worker_id, env.files.path.name, os.getpid())
    master = env.master()
    reporter = Reporter(master, worker_id)

    from elasticdl_nb.runtime.worker.trainer import Trainer, UserCodeError

    try:
        if env.files.read_spec().strategy == Strategy.ALLREDUCE:
            _allreduce(env, worker_id, master, reporter)
        else:
            trainer = Trainer(
                env,
                worker_id,
                reporter,
                lambda: master.GetPsAddresses(pb.Empty(), timeout=10).addresses,
            )
            trainer.prepare()
            _serve(TaskRequests(master, worker_id), trainer, reporter)
    except UserCodeError as exc:
        log.error("user code failed: %s", exc)
        reporter.error(str(exc), user_code=True)
        sys.exit(USER_CODE_EXIT)
    except WrongPeer as exc:
        log.error("%s", exc)
        sys.exit(WRONG_PEER_EXIT)
    except PeerUnreachable:
        reporter.flush()  # (the outage it gave up on, for the journal)
        raise
    reporter.close()
    log.info("worker %d done", worker_id)


def _allreduce(env: ProcessEnv, worker_id: int, master, reporter: Reporter) -> None:
    """A member of the allreduce group (lockstep.py). Failures of the group's transport or
    of the master end the process non-zero (the master relaunches it); anything else
    is the model's or the data's."""
    import grpc

    from elasticdl_nb.runtime.collective.ring import PeerLost
    from elasticdl_nb.runtime.protocol.patience import PeerUnreachable
    from elasticdl_nb.runtime.worker.lockstep import Lockstep
    from elasticdl_nb.runtime.worker.trainer import user_code_error

    try:
        lockstep = Lockstep(env, worker_id, master, reporter)
        lockstep.run()
    except (PeerLost, grpc.RpcError, PeerUnreachable, WrongPeer, SystemExit):
        raise
    except Exception as exc:
        raise user_code_error(exc) from exc


def _serve(tasks: TaskRequests, trainer, reporter: Reporter) -> None:
    while not reporter.stop_requested.is_set():
        task = tasks.next()
        # The previous training task's last push waits for the next training task's first
        # pull; anything else sends it first.
        if task.type != pb.TRAINING and trainer.flush_unsent() and task.type == pb.NONE:
            continue  # that push may have completed the epoch: ask again at once
        if task.type == pb.FINISHED:
            return
        if task.type == pb.NONE:
            time.sleep(task.wait_seconds or 0.2)
            continue
        trainer.run(task)
    trainer.flush_unsent()
