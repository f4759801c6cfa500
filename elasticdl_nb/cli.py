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
from collections.abc import Sequence

from elasticdl_nb.spec import JobSpec, SpecError, option_fields


def add_spec_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per JobSpec option, generated: the CLI cannot drift from the spec."""
    defaults = JobSpec()
    for f in option_fields():
        flag = "--" + f.name.replace("_", "-")
        default = getattr(defaults, f.name)
        help_text = f.metadata["help"]
        if isinstance(default, bool):
            parser.add_argument(
                flag,
                dest=f.name,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=f"{help_text} (default {default})",
            )
        elif isinstance(default, list):
            parser.add_argument(
                flag, dest=f.name, nargs="+", default=argparse.SUPPRESS, help=help_text
            )
        else:
            parser.add_argument(
                flag,
                dest=f.name,
                type=type(default),
                default=argparse.SUPPRESS,
                choices=f.metadata["choices"],
                help=f"{help_text} (default {default!r})",
            )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m elasticdl_nb",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    add_train_command(commands)
    add_job_commands(commands)
    return parser


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
    scale = parsers["scale"] = commands.add_parser("scale", help="change a job's number of workers")
    scale.add_argument("name")
    scale.add_argument("--workers", type=int, required=True)
    logs = parsers["logs"] = commands.add_parser("logs", help="print a process's log")
    logs.add_argument("name")
    logs.add_argument("--role", default="master", choices=("master", "worker", "ps"))
    logs.add_argument("--index", type=int, default=0)
    logs.add_argument("--tail", type=int, default=None)
    for parser in parsers.values():
        add_cluster_flags(parser)
    return parsers


def add_cluster_flags(parser: argparse.ArgumentParser) -> None:
    """Where to look for Kubernetes jobs that another notebook or shell started."""
    parser.add_argument("--namespace", help="also look for Kubernetes jobs in this namespace")
    parser.add_argument("--kubeconfig", default="", help="the cluster's kubeconfig")


def main(argv: Sequence[str] | None = None) -> int:
    import elasticdl_nb as edl
    from elasticdl_nb.backends.kubernetes.api import KubernetesError

    args = vars(build_parser().parse_args(argv))
    command = args.pop("command")

    def find():
        return edl.attach(args["name"], args["namespace"], args["kubeconfig"])

    try:
        if command == "train":
            wait, check, dry_run = args.pop("wait"), args.pop("check"), args.pop("dry_run")
            job = edl.train(check=check, dry_run=dry_run, **args)
            if dry_run:
                print(job, end="")
                return 0
            print(f"started job {job.name} ({job.dir})")
            if wait:
                status = job.wait()
                print(json.dumps({k: status.get(k) for k in ("state", "step", "metrics")}))
        elif command == "list":
            for job in edl.jobs(args["namespace"], args["kubeconfig"]):
                print(f"{job['name']:<40} {job['state']}")
        elif command == "status":
            print(json.dumps(find().status(), indent=1))
        elif command == "wait":
            print(json.dumps(find().wait().get("metrics")))
        elif command == "events":
            for event in find().events(follow=False):
                print(
                    json.dumps(
                        {"seq": event.seq, "time": event.time, "kind": event.kind, **event.data}
                    )
                )
        elif command == "scale":
            print(json.dumps(find().scale(args["workers"])))
        elif command == "stop":
            print(find().stop().get("state"))
        elif command == "logs":
            print(find().logs(args["role"], args["index"], args["tail"]))
    except (
        SpecError,
        ValueError,
        LookupError,
        FileNotFoundError,
        KubernetesError,
        edl.JobFailed,
    ) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
