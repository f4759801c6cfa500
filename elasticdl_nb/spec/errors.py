"""The error every front end reports the same way: a bad option, with its fix."""


class SpecError(ValueError):
    """An option is unknown, of the wrong type or inconsistent; the message says the fix."""
