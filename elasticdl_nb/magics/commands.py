"""`%elasticdl list | attach | status | events | scale | stop | logs | wait`.

The commands and their flags are the CLI's (`elasticdl_nb/cli.py`), so the two cannot
drift; what differs is the output: `attach` returns the `Job` (bind it with
`job = %elasticdl attach NAME`), `stop` asks before stopping unless given `-f`, and
results are shown rather than printed as JSON. `{var}` and `$var` in the line expand from
the notebook's namespace (IPython does that before the magic runs).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any

from IPython.core.magic import Magics, line_magic, magics_class

from elasticdl_nb.cli import add_job_commands
from elasticdl_nb.spec import SpecError


class _UsageShown(Exception):
    """argparse printed the usage (for -h, or with the reason of a bad command line)."""


class _Parser(argparse.ArgumentParser):
    """An argparse parser that reports instead of exiting the kernel."""

    def exit(self, status: int = 0, message: str | None = None):
        if message:
            self._print_message(message)
        raise _UsageShown()

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="%elasticdl", description="Elastic training jobs from a notebook.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    parsers = add_job_commands(commands)
    parsers["stop"].add_argument(
        "-f", "--force", action="store_true", help="stop without asking first"
    )
    attach = commands.add_parser("attach", help="the Job of a running or finished job")
    attach.add_argument("name")
    return parser


@magics_class
class ElasticDLMagics(Magics):
    @line_magic("elasticdl")
    def elasticdl(self, line: str) -> Any:
        """Run `%elasticdl -h` for the commands."""
        try:
            args = vars(build_parser().parse_args(shlex.split(line)))
        except _UsageShown:
            return None
        try:
            return self._run(args.pop("command"), args)
        except (SpecError, ValueError, LookupError, FileNotFoundError) as exc:
            print(f"%elasticdl: {exc}")
            return None

    def _run(self, command: str, args: dict) -> Any:
        import elasticdl_nb as edl

        if command == "list":
            jobs = edl.jobs()
            if not jobs:
                print("no jobs")
            for job in jobs:
                print(f"{job['name']:<40} {job['state']}")
            return None
        job = edl.attach(args["name"])
        if command == "attach":
            return job
        if command == "status":
            return job.status()
        if command == "events":
            for event in job.events(follow=False):
                print(f"{event.seq:>6} {event.kind:<20} {event.data}")
            return None
        if command == "wait":
            return job.wait()
        if command == "scale":
            return job.scale(args["workers"])
        if command == "stop":
            if not args["force"] and input(f"Stop job {job.name}? [y/N] ").strip().lower() not in (
                "y",
                "yes",
            ):
                print("not stopped")
                return None
            return job.stop()
        if command == "logs":
            print(job.logs(args["role"], args["index"], args["tail"]))
            return None
        raise AssertionError(f"unhandled command {command}")  # the parser knows no other
