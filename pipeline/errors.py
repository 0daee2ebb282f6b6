"""The root of Sluice's own errors: the `sluice` command prints any of them as one line."""


class SluiceError(Exception):
    """An error with a message written for the user; no traceback needed."""
