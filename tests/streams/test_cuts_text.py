"""A cut's text refused says what is wrong with it: a number too large is named as such, and
a cut of another stream is not called one of an earlier stream of the same name."""

from __future__ import annotations

import re

import pytest

from pipeline.streams import InvalidCut, StaleCut, StreamCut, open_store

LIMIT = "the most is 9,223,372,036,854,775,807 (2^63-1)"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (
            "v2~a~b~1~0-99999999999999999999999",
            f"99999999999999999999999 is too large for a segment number or offset: {LIMIT}",
        ),
        (
            "v2~a~b~1~9223372036854775808-0",
            f"9223372036854775808 is too large for a segment number or offset: {LIMIT}",
        ),
        (
            "v2~a~b~99999999999999999999~0-0",
            f"99999999999999999999 is too large for a stream id: {LIMIT}",
        ),
        (
            "v1~a~b~0-" + "9" * 5000,  # no int of 5,000 digits (Python refuses to make one)
            f"99999999999999999999... (5,000 digits) is too large for a segment number or"
            f" offset: {LIMIT}",
        ),
    ],
)
def test_a_number_too_large_is_named_as_such(text, reason):
    with pytest.raises(InvalidCut, match=re.escape(f"invalid stream cut {text[:200]!r}: {reason}")):
        StreamCut.parse(text)


def test_numbers_up_to_the_limit_are_read_leading_zeros_and_all():
    cut = StreamCut.parse(f"v2~a~b~{'0' * 30}7~0-9223372036854775807~{'0' * 5000}1-5")
    assert (cut.stream_id, cut.positions) == (7, ((0, 2**63 - 1), (1, 5)))


def test_a_cut_naming_a_newer_stream_id_is_not_called_a_cut_of_an_earlier_stream(tmp_path):
    with open_store(f"embedded:{tmp_path / 's'}") as store:
        store.create_stream("a/b")
        store.create_stream("a/c")
        mine, other = store.tail("a/b").stream_id, store.tail("a/c").stream_id
        assert other > mine
        cut = StreamCut.of("a", "b", {0: 0}, other)
        reason = (
            f"it is a cut of another stream (stream id {other}, which is a/c in this store: a"
            f" cut from another store?), not of a/b, which is stream id {mine}: its positions"
            " mean nothing in a/b; take a cut of a/b (head, tail, a reader group's) instead"
        )
        with pytest.raises(StaleCut, match=re.escape(f"{cut.text!r}: {reason}")):
            list(store.read("a/b", start=cut))
