"""A block's event frames, parsed on every read: each frame is checked before any event of the
block is returned, and events with different routing keys in one block keep their own (issue 11)."""

from __future__ import annotations

import dataclasses
import pickle
import re

import pytest

from pipeline.streams import Event, open_store
from pipeline.streams.embedded.blocks import (
    EVENT,
    BadBlock,
    _equal_frames,
    encode_event,
    encode_header,
    frame_at,
    parse_frames,
    parse_header,
)

EVENTS = [
    (b"one", "a"),
    (b"", "b"),
    (b"three", None),
    (b"four" * 100, "a"),
    (b"five", "\u00e9t\u00e9"),
    (b"six", "b"),
]
AT = 4096  # the block's offset in its segment file


def block(events: list[tuple[bytes, str | None]]) -> tuple[bytes, bytes]:
    body = b"".join(encode_event(payload, key) for payload, key in events)
    head = encode_header(body_crc=0, body_len=len(body), events=len(events), ingest_ns=1)
    return head, body


def frames_of(events: list[tuple[bytes, str | None]], body: bytes | None = None) -> list:
    """The frames of a block of `events`, its body replaced by `body` (damaged) if given."""
    head, stored = block(events)
    header = parse_header(head, 0, AT)
    assert header is not None
    return parse_frames(memoryview(stored if body is None else body), header)


def test_frames_name_each_event_with_its_own_key_and_payload():
    head, body = block(EVENTS)
    frames = frames_of(EVENTS)
    assert [f[2] for f in frames] == [key for _, key in EVENTS]
    assert [body[f[3] : f[4]] for f in frames] == [payload for payload, _ in EVENTS]
    pos = 0
    for i, (offset, end, key, at, until) in enumerate(frames):
        assert (key, at, until - at) == frame_at(body, pos)
        assert offset == (AT if i == 0 else AT + len(head) + pos)
        last = i == len(EVENTS) - 1
        assert end == (AT + len(head) + len(body) if last else AT + len(head) + until)
        pos = until


def test_a_key_that_is_not_utf8_is_bad_even_after_good_ones():
    events = [(b"x", "ab"), (b"y", "ab")]
    _, body = block(events)
    second = len(encode_event(b"x", "ab"))
    damaged = body[: second + EVENT.size] + b"\xff\xfe" + body[second + EVENT.size + 2 :]
    with pytest.raises(BadBlock, match=re.escape("a routing key is not UTF-8")):
        frames_of(events, damaged)


def test_a_key_running_past_the_block_is_bad_even_if_its_start_is_a_known_key():
    events = [(b"", "ab"), (b"", "abc")]
    _, body = block(events)
    cut = body[:-1]  # the second key loses its last byte: its first two equal the first key
    with pytest.raises(BadBlock, match=re.escape("a routing key runs past its block")):
        frames_of(events, cut)


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda b: b[:3], "an event frame is cut short"),
        (lambda b: b"XX" + b[2:], "an event frame has no magic"),
        (lambda b: b[:-1], "event 2 of 2 runs past its block"),
        (lambda b: b + b"!", "1 bytes follow the last of 2 events"),
    ],
)
def test_every_frame_is_checked(damage, problem):
    events = [(b"payload", "k"), (b"more", "k")]
    _, body = block(events)
    with pytest.raises(BadBlock, match=re.escape(problem)):
        frames_of(events, damage(body))


def walked(events: list[tuple[bytes, str | None]]) -> list:
    """A block's frames worked out frame by frame with `frame_at`, as a reader expects them."""
    head, body = block(events)
    frames, pos = [], 0
    for i in range(len(events)):
        key, at, length = frame_at(body, pos)
        start = AT if i == 0 else AT + len(head) + pos
        frames.append((start, AT + len(head) + at + length, key, at, at + length))
        pos = at + length
    return frames


@pytest.mark.parametrize("key", ["k", None, "\u00e9t\u00e9", "x" * 300])
@pytest.mark.parametrize(("count", "size"), [(2, 0), (3, 1), (1000, 17), (16, 65_536)])
def test_a_block_of_equal_frames_is_read_as_any_other(key, count, size):
    """Events of one length under one key (fixed-size samples) are checked in one pass: the
    same frames as a walk over them gives."""
    events = [(bytes([i % 251]) * size, key) for i in range(count)]
    head, body = block(events)
    assert _equal_frames(memoryview(body), parse_header(head, 0, AT)) is not None  # one pass
    frames = frames_of(events)
    assert frames == walked(events)
    assert [body[f[3] : f[4]] for f in frames] == [payload for payload, _ in events]


def _second_head(body: bytes, length: int, new: bytes, at: int = 0) -> bytes:
    """`body` of three equal frames of `length` bytes with bytes `at` of the second replaced."""
    return body[: length + at] + new + body[length + at + len(new) :]


def _every_key(body: bytes, length: int, new: bytes) -> bytes:
    """`body` of three equal frames of `length` bytes with each one-byte key replaced."""
    frames = [body[i * length : (i + 1) * length] for i in range(3)]
    return b"".join(f[: EVENT.size] + new + f[EVENT.size + 1 :] for f in frames)


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda b, n: _second_head(b, n, b"XX"), "an event frame has no magic"),
        (lambda b, n: b[: 2 * n] + EVENT.pack(b"SE", 1, 6) + b[2 * n + 8 :], "event 3 of 3 runs"),
        (lambda b, n: b + b"!", "1 bytes follow the last of 3 events"),
        (lambda b, n: _second_head(b, n, b"\xff", EVENT.size), "a routing key is not UTF-8"),
        (lambda b, n: _every_key(b, n, b"\xff"), "a routing key is not UTF-8"),
    ],
)
def test_a_damaged_frame_among_equal_ones_is_found(damage, problem):
    """A block that is not equal frames throughout, or whose one key is not UTF-8, is walked
    frame by frame and refused where the walk finds the fault."""
    events = [(b"12345", "k")] * 3
    _, body = block(events)
    with pytest.raises(BadBlock, match=re.escape(problem)):
        frames_of(events, damage(body, len(body) // 3))


def test_a_read_returns_mixed_keys_in_one_block(tmp_path):
    with open_store(f"embedded:{tmp_path}") as store:
        store.create_stream("f/mixed")
        with store.writer("f/mixed") as writer:
            for payload, key in EVENTS:
                writer.write(payload, routing_key=key)
        read = [(e.payload, e.routing_key) for e in store.read("f/mixed")]
    assert read == EVENTS


def test_events_read_back_are_ordinary_frozen_events(store):
    """Reads build events without `Event.__init__` (it is slow for a frozen dataclass): they
    must still be equal, hashable, picklable and frozen like any other."""
    store.create_stream("frames/events")
    with store.writer("frames/events") as w:
        w.write(b"payload", routing_key="k")
    (event,) = store.read("frames/events")
    built = Event(*(getattr(event, f.name) for f in dataclasses.fields(Event)))
    assert type(event) is Event
    assert event == built and hash(event) == hash(built) and repr(event) == repr(built)
    assert pickle.loads(pickle.dumps(event)) == event
    assert dataclasses.replace(event, payload=b"other").payload == b"other"
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.payload = b"changed"
