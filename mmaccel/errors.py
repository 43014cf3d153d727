"""Errors a user can act on. Each message names what was wrong and what to do."""


class MMAccelError(Exception):
    """Base class: the CLI prints these as one line instead of a traceback."""


class InputError(MMAccelError, ValueError):
    """A value passed in (shape, dtype, range, name) is not acceptable."""


class ModelNotFoundError(MMAccelError, FileNotFoundError):
    """A checkpoint, weight package or model directory could not be found or read."""


def check(condition: bool, message: str) -> None:
    """Raise `InputError(message)` unless `condition` holds."""
    if not condition:
        raise InputError(message)
