"""Stream cuts: a consistent position across all segments of a stream (Pravega's StreamCut).

A cut maps every segment the stream had at that point (a later scale's may be left out) to a
byte offset on an event boundary: the position of the next event to read in it. Its text form
is stable and versioned, needs no escaping in a URL, a file name, a log line or TOML:

    v2~examples~network~7~0-1024~1-0
    v1~examples~network~0-1024~1-0

that is the version, the scope, the stream, in `v2` the stream's identity (the id the store
gave that stream: a stream deleted and created again under its name gets a new one), then
`segment-offset` (ASCII digits, at most 2^63-1) for each segment in ascending order. Names never
contain `~` (`names.py`): the form is unambiguous. A cut without an identity (one built from
offsets, one a backend without ids gives, one stored before `v2`) is written and read as `v1`,
and is used as it always was: which stream of that name it was taken from cannot be checked.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pipeline.streams.errors import CutStreamMismatch, InvalidCut, InvalidName, StaleCut
from pipeline.streams.names import check_name

CUT_VERSION = "v1"
#: The text version of a cut that names its stream's identity (`StreamCut.stream_id`).
IDENTIFIED_CUT_VERSION = "v2"
_EXPECTED = "expected v2~SCOPE~STREAM~ID~SEGMENT-OFFSET... or v1~SCOPE~STREAM~SEGMENT-OFFSET..."
_SEP = "~"
_POSITION = re.compile(r"([0-9]+)-([0-9]+)", re.ASCII)
_STREAM_ID = re.compile(r"[0-9]+", re.ASCII)
#: Segment numbers and offsets are stored as signed 64-bit integers.
MAX_POSITION = 2**63 - 1


@dataclass(frozen=True, slots=True)
class StreamCut:
    """A position in every segment of one stream (segment number -> byte offset).

    `stream_id` is the identity of the stream the cut was taken from, when its store gives
    one (the embedded store's stream id); None for a cut that does not say (text `v1`)."""

    scope: str
    stream_name: str
    positions: tuple[tuple[int, int], ...]
    stream_id: int | None = None

    @classmethod
    def of(
        cls,
        scope: str,
        stream_name: str,
        positions: Mapping[int, int],
        stream_id: int | None = None,
    ) -> StreamCut:
        ordered = tuple(sorted((int(s), int(o)) for s, o in positions.items()))
        return cls(scope, stream_name, ordered, stream_id)

    def moved_to(self, positions: Mapping[int, int]) -> StreamCut:
        """A cut of the same stream (identity kept) at `positions`."""
        return StreamCut.of(self.scope, self.stream_name, positions, self.stream_id)

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
        if self.stream_id is not None:
            fields = (IDENTIFIED_CUT_VERSION, self.scope, self.stream_name, str(self.stream_id))
            head = _SEP.join(fields)
        return f"{head}{_SEP}{body}" if body else head

    def __str__(self) -> str:
        return self.text

    @classmethod
    def parse(cls, text: str) -> StreamCut:
        """Parse the text form back; a malformed text raises `InvalidCut`."""
        if not isinstance(text, str):
            raise InvalidCut(repr(text), "a cut is a text such as v2~scope~stream~1~0-0")
        parts = text.strip().split(_SEP)
        if len(parts) < 3:
            raise InvalidCut(text, _EXPECTED)
        if parts[0] not in (CUT_VERSION, IDENTIFIED_CUT_VERSION):
            reason = f"unknown cut version {parts[0]!r} (this Sluice reads v1 and v2)"
            raise InvalidCut(text, reason)
        try:
            scope = check_name("scope", parts[1])
            stream = check_name("stream", parts[2])
        except InvalidName as exc:
            raise InvalidCut(text, str(exc)) from None
        stream_id, first = None, 3
        if parts[0] == IDENTIFIED_CUT_VERSION:
            stream_id, first = _stream_id(text, parts[3] if len(parts) > 3 else ""), 4
        positions: dict[int, int] = {}
        for item in parts[first:]:
            found = _POSITION.fullmatch(item)
            if found is None:
                msg = f"{item!r} is not SEGMENT-OFFSET with two numbers of ASCII digits 0-9"
                raise InvalidCut(text, msg)
            seg, off = (
                _number(text, digits, "a segment number or offset") for digits in found.groups()
            )
            if seg in positions:
                raise InvalidCut(text, f"segment {seg} appears twice")
            positions[seg] = off
        return cls.of(scope, stream, positions, stream_id)

    def check_stream(self, scope: str, stream_name: str) -> StreamCut:
        """Return self if this is a cut of `scope/stream_name`, else raise `CutStreamMismatch`."""
        if (self.scope, self.stream_name) != (scope, stream_name):
            raise CutStreamMismatch(self.text, self.stream, f"{scope}/{stream_name}")
        return self

    def check_same_stream(self, current: StreamCut) -> StreamCut:
        """Return self if it is a cut of the stream `current` (a cut the store gives now: its
        head or tail) is of. `CutStreamMismatch` for another name; `StaleCut` when both name
        a stream id and the ids differ (the stream was deleted and created again since this
        cut was taken). A cut without an identity on either side cannot be checked: it passes."""
        self.check_stream(current.scope, current.stream_name)
        mine, now = self.stream_id, current.stream_id
        if mine is not None and now is not None and mine != now:
            raise StaleCut(self.text, self.stream, mine, now)
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


def _stream_id(text: str, field: str) -> int:
    if _STREAM_ID.fullmatch(field) is None:
        reason = f"{field!r} is not a stream id (v2~SCOPE~STREAM~ID~SEGMENT-OFFSET...)"
        raise InvalidCut(text, reason)
    return _number(text, field, "a stream id")


def _number(text: str, digits: str, what: str) -> int:
    """The number ASCII `digits` write, if it fits a signed 64-bit integer; else `InvalidCut`
    saying it is too large (without making an int of thousands of digits)."""
    significant = digits.lstrip("0")
    if len(significant) > len(str(MAX_POSITION)) or int(significant or "0") > MAX_POSITION:
        shown = digits if len(digits) <= 24 else f"{digits[:20]}... ({len(digits):,} digits)"
        reason = f"{shown} is too large for {what}: the most is {MAX_POSITION:,} (2^63-1)"
        raise InvalidCut(text, reason)
    return int(significant or "0")


def as_cut(value: StreamCut | str) -> StreamCut:
    return value if isinstance(value, StreamCut) else StreamCut.parse(value)


def merge_positions(cuts: Iterable[StreamCut]) -> dict[int, int]:
    """The latest position per segment over several cuts of one stream."""
    merged: dict[int, int] = {}
    for cut in cuts:
        for seg, off in cut.positions:
            merged[seg] = max(off, merged.get(seg, off))
    return merged
