"""`python -m elasticdl_nb` (or `elasticdl-nb`): the SDK from a shell.

train    start a job; every JobSpec option is a flag (--workers, --minibatch-size, ...)
list     the local jobs           status NAME    state and progress as JSON
wait     follow a job to its end  events NAME    the journal as JSON lines
scale    NAME --workers N         stop NAME      logs NAME [--role R --index I]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from elasticdl_nb.commands import (
    CommandLineError,
    CommandParser,
    add_job_commands,
    add_train_command,
    in_flags,
    run,
)
from elasticdl_nb.errors import ElasticDLError
from elasticdl_nb.sdk import train

USER_ERROR = 2  # the exit code of a user's mistake (argparse's too)
INTERRUPTED = 130


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="python -m elasticdl_nb",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    add_train_command(commands)
    add_job_commands(commands)
    return parser


def _event_line(event) -> str:
    return json.dumps({"seq": event.seq, "time": event.time, "kind": event.kind, **event.data})


# How a shell shows each job command's result (commands.run returns it): JSON or text.
SHOW: dict[str, Callable[[Any], str]] = {
    "list": lambda jobs: "\n".join(f"{job['name']:<40} {job['state']}" for job in jobs),
    "status": lambda status: json.dumps(status, indent=1),
    "wait": lambda status: json.dumps(status.get("metrics")),
    "events": lambda events: "\n".join(map(_event_line, events)),
    "scale": json.dumps,
    "stop": lambda status: status.get("state"),
    "logs": str,
}


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = vars(build_parser().parse_args(argv))
        command = args.pop("command")
        if command == "train":
            _train(args)
        else:
            text = SHOW[command](run(command, args))
            if text:
                print(text)
    except CommandLineError as exc:  # one line, no usage: `-h` shows that
        print(f"{exc.prog}: error: {exc}", file=sys.stderr)
        return USER_ERROR
    except ElasticDLError as exc:
        print(f"error: {in_flags(str(exc))}", file=sys.stderr)
        return USER_ERROR
    except KeyboardInterrupt:  # jobs run detached from this shell: a Ctrl-C ends no job
        print("interrupted (a job that was running goes on: `stop NAME` ends it)", file=sys.stderr)
        return INTERRUPTED
    return 0


def _train(args: dict) -> None:
    wait, check, dry_run = args.pop("wait"), args.pop("check"), args.pop("dry_run")
    # Without --data, edl.train says what to pass (rather than a missing argument).
    job = train(data=args.pop("data", None), check=check, dry_run=dry_run, **args)
    if dry_run:  # the YAML of every object it would create; nothing was launched
        print(job, end="")
        return
    print(f"started job {job.name} ({job.dir})")
    if wait:
        status = job.wait()
        print(json.dumps({k: status.get(k) for k in ("state", "step", "metrics")}))
