"""`run(command, args)`: one job command through the SDK, its result returned, not shown.

`args` are the parsed flags (a dict; keys a front end added of its own are ignored).
`list` returns `edl.jobs()`; every other command finds the job by name (`edl.attach`,
with `--namespace`/`--kubeconfig`) and returns what its `Job` method returns: the `Job`
itself (attach), a status dict (status, wait, scale, stop), the journal as a list of
events, a log's text. Errors a user can fix are raised as `ElasticDLError`s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from elasticdl_nb.sdk import Job, attach, jobs

# What each command does to the job it names.
JOB_COMMANDS: dict[str, Callable[[Job, Mapping[str, Any]], Any]] = {
    "attach": lambda job, args: job,
    "status": lambda job, args: job.status(),
    "events": lambda job, args: list(job.events(follow=False)),
    "wait": lambda job, args: job.wait(),
    "scale": lambda job, args: job.scale(args["workers"]),
    "stop": lambda job, args: job.stop(),
    "logs": lambda job, args: job.logs(args["role"], args["index"], args["tail"]),
}


def run(
    command: str,
    args: Mapping[str, Any],
    confirm: Callable[[str], bool] | None = None,
) -> Any:
    """Do `command` with the parsed `args`; its result. With `confirm`, `stop` first asks
    it (a yes/no question) and, if the answer is no, stops nothing and returns None."""
    namespace, kubeconfig = args.get("namespace"), args.get("kubeconfig", "")
    if command == "list":
        return jobs(namespace, kubeconfig)
    job = attach(args["name"], namespace, kubeconfig)
    if command == "stop" and confirm is not None and not confirm(f"Stop job {job.name}?"):
        return None
    return JOB_COMMANDS[command](job, args)
