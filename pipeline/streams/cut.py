"""Stream cuts: a consistent position across all segments of a stream (Pravega's StreamCut).

A cut maps every segment the stream had at that point (a later scale's may be left out) to a
byte offset on an event boundary: the position of the next event to read in it. Its text form
is stable and versioned, needs no escaping in a URL, a file name, a log line or TOML:

    v1~examples~network~0-1024~1-0

that is `v1`, the scope, the stream, then `segment-offset` (ASCII digits, at most 2^63-1) for
each segment in ascending order. Names never contain `~` (`names.py`): the form is unambiguous.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pipeline.streams.errors import CutStreamMismatch, InvalidCut, InvalidName
from pipeline.streams.names import check_name

CUT_VERSION = "v1"
_SEP = "~"
_POSITION = re.compile(r"([0-9]{1,19})-([0-9]{1,19})", re.ASCII)
#: Segment numbers and offsets are stored as signed 64-bit integers.
MAX_POSITION = 2**63 - 1


@dataclass(frozen=True, slots=True)
class StreamCut:
    """A position in every segment of one stream (segment number -> byte offset)."""

    scope: str
    stream_name: str
    positions: tuple[tuple[int, int], ...]

    @classmethod
    def of(cls, scope: str, stream_name: str, positions: Mapping[int, int]) -> StreamCut:
        ordered = tuple(sorted((int(s), int(o)) for s, o in positions.items()))
        return cls(scope, stream_name, ordered)

    @property
    def stream(self) -> str:
        """The qualified stream name, `scope/stream`."""
        return f"{self.scope}/{self.stream_name}"

    @property
    def segments(self) -> dict[int, int]:
        return dict(self.positions)

    def offset(self, segment: int) -> int | None:
        for seg, off in self.positions:
            if seg == segment:
                return off
        return None

    @property
    def text(self) -> str:
        body = _SEP.join(f"{seg}-{off}" for seg, off in self.positions)
        head = _SEP.join((CUT_VERSION, self.scope, self.stream_name))
        return f"{head}{_SEP}{body}" if body else head

    def __str__(self) -> str:
        return self.text

    @classmethod
    def parse(cls, text: str) -> StreamCut:
        """Parse the text form back; a malformed text raises `InvalidCut`."""
        if not isinstance(text, str):
            raise InvalidCut(repr(text), "a cut is a text such as v1~scope~stream~0-0")
        parts = text.strip().split(_SEP)
        if len(parts) < 3:
            raise InvalidCut(text, "expected v1~SCOPE~STREAM~SEGMENT-OFFSET...")
        if parts[0] != CUT_VERSION:
            raise InvalidCut(text, f"unknown cut version {parts[0]!r} (this Sluice reads v1)")
        try:
            scope = check_name("scope", parts[1])
            stream = check_name("stream", parts[2])
        except InvalidName as exc:
            raise InvalidCut(text, str(exc)) from None
        positions: dict[int, int] = {}
        for item in parts[3:]:
            found = _POSITION.fullmatch(item)
            if found is None:
                msg = f"{item!r} is not SEGMENT-OFFSET with two numbers of ASCII digits 0-9"
                raise InvalidCut(text, msg)
            seg, off = int(found[1]), int(found[2])
            if seg > MAX_POSITION or off > MAX_POSITION:
                raise InvalidCut(text, f"{item!r} is out of range (at most {MAX_POSITION})")
            if seg in positions:
                raise InvalidCut(text, f"segment {seg} appears twice")
            positions[seg] = off
        return cls.of(scope, stream, positions)

    def check_stream(self, scope: str, stream_name: str) -> StreamCut:
        """Return self if this is a cut of `scope/stream_name`, else raise `CutStreamMismatch`."""
        if (self.scope, self.stream_name) != (scope, stream_name):
            raise CutStreamMismatch(self.text, self.stream, f"{scope}/{stream_name}")
        return self

    def spans_until(self, end: StreamCut) -> list[tuple[int, int, int]]:
        """(segment, start, end) of each segment `end` names, in segment order: what lies
        between this cut and a later one (a whole later cut names every segment this one
        does). A segment this cut does not name was created after it, by a scale: its span
        starts at offset 0, its beginning. Never at its head: a read from before a truncation
        must raise `Truncated`, not skip the events it dropped. A span may end before it
        starts when `end` is not later in that segment: the caller refuses such a pair."""
        begin = self.segments
        return [(seg, begin.get(seg, 0), off) for seg, off in end.positions]

    def bytes_until(self, other: StreamCut) -> int:
        """Bytes between this cut and a later one, segments created since this cut included."""
        return sum(max(0, stop - start) for _, start, stop in self.spans_until(other))


def as_cut(value: StreamCut | str) -> StreamCut:
    return value if isinstance(value, StreamCut) else StreamCut.parse(value)


def merge_positions(cuts: Iterable[StreamCut]) -> dict[int, int]:
    """The latest position per segment over several cuts of one stream."""
    merged: dict[int, int] = {}
    for cut in cuts:
        for seg, off in cut.positions:
            merged[seg] = max(off, merged.get(seg, off))
    return merged
