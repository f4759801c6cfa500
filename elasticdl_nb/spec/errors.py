"""The error every front end reports the same way: a bad option, with its fix."""

from elasticdl_nb.errors import ElasticDLError


class SpecError(ElasticDLError, ValueError):
    """An option is unknown, of the wrong type or inconsistent; the message says the fix."""
