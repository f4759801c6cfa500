"""The notebook's defaults for new jobs: `%elasticdl config` and `%config ElasticDL.<option>`.

`ElasticDL` is a traitlets `Configurable` with one trait per JobSpec option that makes
sense as a default (not the per-job ones: name, data, model), generated from the spec so
the two cannot drift. IPython's own `%config ElasticDL.workers = 3` and a profile's
`c.ElasticDL.workers = 3` set the same traits as `%elasticdl config workers=3`; flags on
`%%elasticdl train` win over all of them. Values are checked by JobSpec when a job starts.
"""

from __future__ import annotations

from typing import Any

from traitlets import Bool, Enum, Int, TraitError, Unicode, Union
from traitlets.config import Configurable

from elasticdl_nb.spec import JobSpec, SpecError, closest, option_fields

_PER_JOB = {"name", "data", "validation_data", "prediction_data", "model_def", "model_zoo"}
_TRAITS = {bool: Bool, int: Int, str: Unicode}


class _NumberOrText(Union):
    """A number, or its text form read by the spec's own reader (a worker range, '2:6'),
    so `workers=lots` is refused when it is set, not when a job starts."""

    def __init__(self, number: Any, read: Any, **kwargs: Any) -> None:
        super().__init__([number, Unicode()], default_value=number.default_value, **kwargs)
        self._read = read

    def validate(self, obj: Any, value: Any) -> Any:
        value = super().validate(obj, value)
        if isinstance(value, str):
            try:
                self._read(value)
            except SpecError as exc:
                raise TraitError(str(exc)) from None
        return value


def _option_traits() -> dict[str, Any]:
    defaults = JobSpec()
    traits: dict[str, Any] = {}
    for f in option_fields():
        default = getattr(defaults, f.name)
        if f.name in _PER_JOB or type(default) not in _TRAITS:
            continue
        trait = _TRAITS[type(default)](default, help=f.metadata["help"])
        if f.metadata["text"]:
            trait = _NumberOrText(trait, f.metadata["text"], help=f.metadata["help"])
        traits[f.name] = trait.tag(config=True)
    traits["dashboard"] = Enum(
        ["auto", "widget", "text"],
        "auto",
        help="How jobs are shown: 'widget' (the live dashboard), 'text' (progress lines), "
        "or 'auto' (the dashboard where a widget front end is connected).",
    ).tag(config=True)
    return traits


ElasticDL = type(
    "ElasticDL",
    (Configurable,),
    {"__doc__": "Defaults for the jobs `%%elasticdl train` starts.", **_option_traits()},
)


def job_defaults(config: Configurable) -> dict[str, Any]:
    """The JobSpec options whose value differs from the spec's own default."""
    defaults = JobSpec()
    return {
        name: getattr(config, name)
        for name in config.trait_names(config=True)
        if hasattr(defaults, name) and getattr(config, name) != getattr(defaults, name)
    }


def show(config: Configurable) -> str:
    lines = []
    for name in sorted(config.trait_names(config=True)):
        trait = config.traits()[name]
        value = getattr(config, name)
        mark = "" if value == trait.default_value else f"   (default {trait.default_value!r})"
        lines.append(f"{name:<28} {value!r}{mark}")
    return "\n".join(lines)


def assign(config: Configurable, settings: list[str]) -> None:
    """Apply `option=value` settings (values as on a command line: 3, true, adam)."""
    known = config.trait_names(config=True)
    for setting in settings:
        name, sep, text = setting.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or name not in known:
            close = closest(name, known)
            raise SpecError(
                f"Cannot set {setting!r}: "
                + (f"did you mean {close}? " if close else "")
                + f"Write option=value with one of {', '.join(known)}."
            )
        trait = config.traits()[name]
        try:
            value = trait.from_string(text.strip())
            setattr(config, name, value)
        except Exception as exc:  # traitlets' TraitError and the conversions' ValueError
            raise SpecError(f"Cannot set {name} to {text.strip()!r}: {exc}") from exc
