"""Options that several commands share, declared once."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any


def slices_stream_option(parser: argparse.ArgumentParser) -> None:
    """`--slices-stream`: the stream slices are recorded in (Sluice's default one)."""
    from pipeline.jobs.slices import DEFAULT_SLICES_STREAM

    parser.add_argument(
        "--slices-stream",
        default=DEFAULT_SLICES_STREAM,
        metavar="SCOPE/STREAM",
        help="the stream the slices are recorded in",
    )


def whole_number(minimum: int, rule: str) -> Callable[[str], int]:
    """An argparse type: a whole number, at least `minimum`. Anything else is refused with
    `rule` (what the option takes), which argparse prints as one line naming the option."""
    return _number(int, "a whole number", lambda value: value >= minimum, rule)


def positive_number(rule: str) -> Callable[[str], float]:
    """An argparse type: a finite number above 0, else refused with `rule` (as `whole_number`)."""
    return _number(float, "a number", lambda value: math.isfinite(value) and value > 0, rule)


def _number(kind: type, what: str, fits: Callable[[Any], bool], rule: str) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            msg = f"{text!r} is not {what}: {rule}"
            raise argparse.ArgumentTypeError(msg) from None
        if not fits(value):
            msg = f"{text}: {rule}"
            raise argparse.ArgumentTypeError(msg)
        return value

    return parse
