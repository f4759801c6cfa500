"""The commands on jobs, defined once for every front end.

The CLI (`elasticdl_nb/cli.py`) and the `%elasticdl` magic (`elasticdl_nb/magics/`) build
their parsers from `parsers` (the same commands, flags and help texts) on a
`CommandParser` (the same one-line report of a bad command line), hand a parsed job
command to `run`, which does it through the SDK and returns its result, and each renders
that result its own way: JSON and text in a shell; return values, text and the dashboard
in a notebook. What a user can fix arrives as an `ElasticDLError`, and both front ends show
its message only (`in_flags`: with the options it names as flags), never a traceback.

    command_line  `CommandParser` (a bad command line is one line: the closest flag, the
                  choices), `CommandLineError`, `in_flags` (an error's options as flags)
    parsers       the argparse definitions: `train` (a flag per JobSpec option), the job
                  commands (list, status, events, wait, scale, stop, logs), attach
    run           `run(command, args)`: one command on one job (or the list), its result
"""

from elasticdl_nb.commands.command_line import CommandLineError, CommandParser, flag, in_flags
from elasticdl_nb.commands.parsers import (
    add_attach_command,
    add_cluster_flags,
    add_job_commands,
    add_spec_flags,
    add_train_command,
)
from elasticdl_nb.commands.run import JOB_COMMANDS, run

__all__ = [
    "JOB_COMMANDS",
    "CommandLineError",
    "CommandParser",
    "add_attach_command",
    "add_cluster_flags",
    "add_job_commands",
    "add_spec_flags",
    "add_train_command",
    "flag",
    "in_flags",
    "run",
]
