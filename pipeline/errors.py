"""The root of Sluice's own errors: the `sluice` command prints any of them as one line."""

from __future__ import annotations

from typing import Any


class SluiceError(Exception):
    """An error with a message written for the user; no traceback needed.

    Errors survive pickling (Spark ships them between processes) with their fields and
    message, though their constructors take fields rather than the message: the default
    pickling would call `cls(message)`.
    """

    def __reduce__(self) -> tuple[Any, ...]:
        return _restore, (type(self), self.args, self.__dict__)


def _restore(cls: type[SluiceError], args: tuple[Any, ...], fields: dict[str, Any]) -> SluiceError:
    """An unpickled error: made without its constructor (as dlt's `DltException` is), given
    its message and fields back."""
    error = cls.__new__(cls, *args)
    error.args = args  # an OSError subclass leaves `args` to the __init__ not called here
    error.__dict__.update(fields)
    return error
