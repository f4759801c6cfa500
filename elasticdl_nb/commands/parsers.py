"""The argparse definitions of every command, shared by the CLI and the `%elasticdl` magic:
a front end adds them to its own `CommandParser` (command_line.py: a bad command line is
one line) and may add flags of its own (the magic's `-o`, `--model`, `stop -f`)."""

from __future__ import annotations

import argparse

from elasticdl_nb.commands.command_line import flag
from elasticdl_nb.spec import JobSpec, option_fields


def add_spec_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per JobSpec option, generated: the CLI cannot drift from the spec."""
    defaults = JobSpec()
    for f in option_fields():
        default = getattr(defaults, f.name)
        help_text = f.metadata["help"]
        if isinstance(default, bool):
            parser.add_argument(
                flag(f.name),
                dest=f.name,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=f"{help_text} (default {default})",
            )
        elif isinstance(default, list):
            parser.add_argument(
                flag(f.name), dest=f.name, nargs="+", default=argparse.SUPPRESS, help=help_text
            )
        else:
            parser.add_argument(
                flag(f.name),
                dest=f.name,
                type=str if f.metadata["text"] else type(default),
                default=argparse.SUPPRESS,
                choices=f.metadata["choices"],
                help=f"{help_text} (default {default!r})",
            )


def add_train_command(commands) -> argparse.ArgumentParser:
    """`train` with a flag per JobSpec option, shared by the CLI and `%%elasticdl train`."""
    train = commands.add_parser("train", help="start a training job")
    add_spec_flags(train)
    train.add_argument("--wait", action="store_true", help="follow the job until it ends")
    train.add_argument(
        "--no-check",
        dest="check",
        action="store_false",
        help="skip the one-minibatch check before launching",
    )
    train.add_argument(
        "--dry-run",
        action="store_true",
        help="print the Kubernetes objects the job would create, as YAML; launch nothing",
    )
    return train


def add_job_commands(commands) -> dict[str, argparse.ArgumentParser]:
    """The commands on existing jobs, shared by the CLI and the `%elasticdl` magic."""
    parsers = {"list": commands.add_parser("list", help="list local jobs")}
    for name, text in (
        ("status", "a job's status"),
        ("wait", "follow a job to its end"),
        ("stop", "stop a job"),
        ("events", "print a job's journal"),
    ):
        parsers[name] = commands.add_parser(name, help=text)
        parsers[name].add_argument("name")
    scale = parsers["scale"] = commands.add_parser(
        "scale", help="change a job's number of workers, or its range MIN:MAX"
    )
    scale.add_argument("name")
    scale.add_argument("--workers", required=True, help="N, or a range MIN:MAX (e.g. 2:6)")
    logs = parsers["logs"] = commands.add_parser("logs", help="print a process's log")
    logs.add_argument("name")
    logs.add_argument("--role", default="master", choices=("master", "worker", "ps"))
    logs.add_argument("--index", type=int, default=0)
    logs.add_argument("--tail", type=int, default=None)
    for parser in parsers.values():
        add_cluster_flags(parser)
    return parsers


def add_attach_command(commands) -> argparse.ArgumentParser:
    """`attach NAME`: the job's `Job` (the notebook shows its dashboard and returns it)."""
    attach = commands.add_parser("attach", help="show a job's dashboard and return its Job")
    attach.add_argument("name")
    add_cluster_flags(attach)
    return attach


def add_cluster_flags(parser: argparse.ArgumentParser) -> None:
    """Where to look for Kubernetes jobs that another notebook or shell started."""
    parser.add_argument("--namespace", help="also look for Kubernetes jobs in this namespace")
    parser.add_argument("--kubeconfig", default="", help="the cluster's kubeconfig")
