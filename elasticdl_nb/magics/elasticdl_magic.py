"""`%%elasticdl train` and `%elasticdl list | attach | status | events | wait | scale |
stop | logs | config`.

The commands and their flags are the CLI's (`elasticdl_nb/commands/`), so the two cannot
drift, and so is what they do (`commands.run`); what differs is the output: `train` shows
the dashboard, `attach` shows it and returns the `Job` (bind it with
`job = %elasticdl attach NAME`), `stop` asks before stopping unless given `-f`, and results
are shown rather than printed as JSON. `{var}` and `$var` in the line expand from the
notebook's namespace (IPython does that). A user's mistake, or a job that failed, is one
line on stderr, `%elasticdl <command>: <what to do>`, never a traceback.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable
from typing import Any

from IPython.core.magic import Magics, line_cell_magic, magics_class

from elasticdl_nb.commands import (
    CommandLineError,
    CommandParser,
    add_attach_command,
    add_job_commands,
    add_train_command,
    in_flags,
    run,
)
from elasticdl_nb.errors import ElasticDLError
from elasticdl_nb.magics import config as defaults
from elasticdl_nb.magics.train import model_entries, resolve_data
from elasticdl_nb.sdk import JobFailed, train
from elasticdl_nb.sdk.view.text import format_progress


class _UsageShown(Exception):
    """argparse printed the usage (for -h)."""


class _Parser(CommandParser):
    """The commands' parser, which shows `-h` instead of exiting the kernel."""

    def exit(self, status: int = 0, message: str | None = None):
        if message:
            self._print_message(message)
        raise _UsageShown()


def build_parser() -> CommandParser:
    parser = _Parser(prog="%elasticdl", description="Elastic training jobs from a notebook.")
    commands = parser.add_subparsers(dest="command", required=True)
    train = add_train_command(commands)
    train.prog = "%%elasticdl train"
    train.add_argument("-o", "--output", metavar="NAME", help="bind the Job to this variable")
    train.add_argument(
        "--model",
        metavar="NAME",
        help="the variable holding the Keras model (or custom_model function) to train",
    )
    parsers = add_job_commands(commands)
    parsers["stop"].add_argument(
        "-f", "--force", action="store_true", help="stop without asking first"
    )
    add_attach_command(commands)
    settings = commands.add_parser(
        "config", help="show the defaults for new jobs, or set them: config workers=3 epochs=2"
    )
    settings.add_argument("settings", nargs="*", metavar="OPTION=VALUE")
    settings.add_argument("--reset", action="store_true", help="back to the built-in defaults")
    return parser


# How the notebook shows each job command's result (`commands.run` returns it): what a
# renderer returns is the magic's value, which IPython displays (`attach` is a method:
# it shows the dashboard).
def _returned(result: Any) -> Any:
    return result


def _printed(text: str) -> None:
    print(text)


def _job_lines(jobs: list[dict]) -> None:
    if not jobs:
        print("no jobs")
    for job in jobs:
        print(f"{job['name']:<40} {job['state']}")


def _event_lines(events: list) -> None:
    for event in events:
        print(f"{event.seq:>6} {event.kind:<20} {event.data}")


def _status(status: dict) -> dict:
    """The status in a line a person reads first (its epochs counted from 1, as the
    progress line counts them: a finished 3-epoch job is at epoch 3/3), then the dict."""
    line = [f"{status.get('name', 'job')}: {status.get('state', '?')}"]
    if status.get("phase"):
        line.append(f"phase {status['phase']}")
    if status.get("epochs"):
        line.append(format_progress(status))
    print(" | ".join(line))
    return status


def _stopped(status: dict | None) -> dict | None:
    if status is None:  # the user answered no
        print("not stopped")
    return status


SHOW: dict[str, Callable[[Any], Any]] = {
    "list": _job_lines,
    "status": _status,
    "events": _event_lines,
    "wait": _returned,
    "scale": _returned,
    "stop": _stopped,
    "logs": _printed,
}


def _ask(question: str) -> bool:
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


@magics_class
class ElasticDLMagics(Magics):
    def __init__(self, shell):
        super().__init__(shell)
        self.config_defaults = defaults.ElasticDL(parent=shell)
        shell.configurables.append(self.config_defaults)  # %config ElasticDL.<option>=...
        self.show = {**SHOW, "attach": self._attached}

    @line_cell_magic("elasticdl")
    def elasticdl(self, line: str, cell: str | None = None) -> Any:
        """Run `%elasticdl -h` for the commands; `%%elasticdl train -h` for training."""
        try:
            args = vars(build_parser().parse_args(shlex.split(line)))
        except _UsageShown:
            return None
        except CommandLineError as exc:  # one line: the closest flag, or the choices
            print(f"{exc.prog}: {exc}", file=sys.stderr)
            return None
        command = args.pop("command")
        if (command == "train") != (cell is not None):
            print(
                "%elasticdl: train is a cell magic (%%elasticdl train, then the model "
                "code below it)"
                if cell is None
                else f"%%elasticdl: only train takes a cell; use %elasticdl {command}"
            )
            return None
        try:
            if command == "train":
                return self._train(args, cell)
            if command == "config":
                return self._config(args)
            confirm = None if args.get("force", True) else _ask
            return self.show[command](run(command, args, confirm=confirm))
        except ElasticDLError as exc:  # a user's mistake, or a job that failed: no traceback
            print(f"%elasticdl {command}: {in_flags(str(exc))}", file=sys.stderr)
            if command == "train":
                print("No job was launched.", file=sys.stderr)
            return None
        except KeyboardInterrupt:
            if command != "wait":
                raise
            print(
                f"Stopped waiting for {args['name']}, which goes on. "
                f"Reattach: %elasticdl attach {args['name']}"
            )
            return None

    # ------------------------------------------------------------------ train

    def _train(self, args: dict, cell: str) -> None:
        result = self.shell.run_cell(cell)
        if not result.success:
            print(
                "%%elasticdl train: the cell raised an error (shown above); no job was launched.",
                file=sys.stderr,
            )
            return None
        namespace = self.shell.user_ns
        wait, check, dry_run = args.pop("wait"), args.pop("check"), args.pop("dry_run")
        output, model_name = args.pop("output"), args.pop("model")
        entries = model_entries(namespace, cell, model_name)
        data = resolve_data(namespace, "data", args.pop("data", None))
        validation = resolve_data(namespace, "validation_data", args.pop("validation_data", None))
        prediction = resolve_data(namespace, "prediction_data", args.pop("prediction_data", None))
        options = {**defaults.job_defaults(self.config_defaults), **args}
        job = train(
            entries.pop("custom_model"),
            **entries,
            data=data,
            validation_data=validation,
            prediction_data=prediction,
            check=check,
            dry_run=dry_run,
            **options,
        )
        if dry_run:  # the YAML of every object it would create; nothing was launched
            print(job, end="")
            return None
        if output:
            namespace[output] = job
        captured = (job.bundle_dir / "captured.txt").read_text().strip()
        print(f"Started job {job.name} (captured {captured}).")
        self._follow(job, wait)
        return None

    def _follow(self, job, wait: bool) -> None:
        """Show the job (the dashboard where a widget front end is connected, else text
        progress), and with `wait` block until it ends; an interrupt only detaches."""
        dashboard = self._show(job)
        if not wait:
            if not dashboard:
                print(f"Follow it with: %elasticdl wait {job.name}")
            return
        try:
            job.wait(progress=not dashboard)
        except KeyboardInterrupt:
            print(
                f"Detached from {job.name}, which goes on. Reattach: %elasticdl attach {job.name}"
            )
        except JobFailed as exc:
            print(f"Job {job.name} failed: {exc}", file=sys.stderr)

    def _show(self, job) -> bool:
        """Display the job's dashboard if widgets can be shown here; whether it was."""
        from elasticdl_nb import widgets

        mode = self.config_defaults.dashboard
        if mode == "text" or (mode == "auto" and not widgets.widget_frontend_available()):
            return False
        widgets.show(job, text=False)
        return True

    # ------------------------------------------------------------------ the other commands

    def _attached(self, job):
        """`attach`: the dashboard (where widgets can be shown), and the Job as the value."""
        self._show(job)
        return job

    def _config(self, args: dict) -> None:
        if args["reset"]:
            for name, trait in self.config_defaults.traits(config=True).items():
                setattr(self.config_defaults, name, trait.default_value)
        defaults.assign(self.config_defaults, args["settings"])
        print(defaults.show(self.config_defaults))
