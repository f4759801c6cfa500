"""How the front ends with a command line (the CLI, the `%elasticdl` magic) read to a user.

`CommandParser` is the argparse parser of their commands. It reports a bad command line
as one line, raised as a `CommandLineError`, never as the usage: an unknown flag names
the closest known one, an invalid choice lists the choices. `in_flags` spells the options
an error names as flags: a hint written for `edl.train(namespace=...)` reads
`--namespace ...` there, so a user is told what to type where they are typing.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence

from elasticdl_nb.errors import ElasticDLError
from elasticdl_nb.spec import closest, option_fields


class CommandLineError(ElasticDLError, ValueError):
    """A command line the parser refused; the message is the one line that says why."""

    def __init__(self, prog: str, message: str):
        super().__init__(message)
        self.prog = prog  # the (sub)command's, e.g. '%%elasticdl train'


def flag(option: str) -> str:
    """The flag of a JobSpec option: 'minibatch_size' -> '--minibatch-size'."""
    return "--" + option.replace("_", "-")


class CommandParser(argparse.ArgumentParser):
    """An argparse parser whose errors are one `CommandLineError` line (the usage is for
    `-h`); its subcommands' parsers are of the same class."""

    def parse_known_args(self, args: Sequence[str] | None = None, namespace=None):
        # A command's parser is handed the rest of the line: what it does not know is
        # reported here, against its own flags, not as the top level's "unrecognized".
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(self._unexpected(extras[0]))
        return parsed, extras

    def _check_value(self, action: argparse.Action, value) -> None:
        if action.choices is not None and value not in action.choices:
            choices = [str(c) for c in action.choices]  # (a StrEnum's repr is not its name)
            close = closest(str(value), choices)
            raise argparse.ArgumentError(
                action,
                f"invalid choice: {value!r} (choose from {', '.join(choices)})"
                + (f"; did you mean {close}?" if close else ""),
            )

    def error(self, message: str):
        raise CommandLineError(self.prog, message)

    def _unexpected(self, word: str) -> str:
        if not word.startswith("-"):
            return f"unexpected argument {word!r}"
        given = word.partition("=")[0]
        known = [s for action in self._actions for s in action.option_strings]
        close = closest(given, [s for s in known if s.startswith("--")])
        hint = f"did you mean {close}?" if close else f"`{self.prog} -h` lists them"
        return f"unknown option {given}: {hint}"


def _option_spellings() -> tuple[re.Pattern, re.Pattern]:
    names = "|".join(sorted((f.name for f in option_fields()), key=len, reverse=True))
    # `name=`, `name='value'`, `name=True`, but not a keyword inside a call's parentheses
    # (`edl.train(data=(x, y))` is Python to copy, not a hint).
    keyword = re.compile(rf"(?<![\w.])(?<!\w\()({names})=('[^']*'|True\b|False\b)?")
    quoted = re.compile(rf"\b([Oo]ption) '({names})'")
    return keyword, quoted


_KEYWORD, _QUOTED = _option_spellings()


def _as_flag(match: re.Match) -> str:
    name, value = match.group(1), match.group(2)
    if value == "False":
        return flag("no_" + name)
    if value is None or value == "True":
        return flag(name)
    quoted = value[1:-1]
    return f"{flag(name)} {quoted or repr('')}"


def in_flags(message: str) -> str:
    """`message` with the options it names spelt as flags: `namespace=` -> `--namespace`,
    `strategy='ps'` -> `--strategy ps`, `tls=True` -> `--tls`, `Option 'workers'` ->
    `Option --workers`."""
    message = _KEYWORD.sub(_as_flag, message)
    return _QUOTED.sub(lambda m: f"{m.group(1)} {flag(m.group(2))}", message)
