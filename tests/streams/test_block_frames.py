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
