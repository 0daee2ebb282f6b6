"""What `resolve` says of a doubtful transaction, read against a real embedded store: the
verdict and reason for each case, in words that agree with the count (one event or many)."""

from __future__ import annotations

import pytest

from collectors.buffer.schema import BufferedEvent, TxnRecord
from collectors.resolve import search
from pipeline.streams import open_store

STREAM = "lab/resolve"


def doubtful(payloads: list[bytes]) -> tuple[TxnRecord, list[BufferedEvent]]:
    rows = [BufferedEvent(i + 1, p, "k", 0, 0, 1) for i, p in enumerate(payloads)]
    record = TxnRecord("txn-1", STREAM, "doubtful", 1, len(rows), len(rows), len(rows), 0, 0, 0)
    return record, rows


@pytest.fixture
def store_uri(tmp_path):
    uri = f"embedded:{tmp_path / 'store'}"
    with open_store(uri) as store:
        store.create_stream(STREAM)
        with store.writer(STREAM) as writer:
            writer.write(b"already-there", "k")
    return uri


@pytest.mark.parametrize(
    ("payloads", "verdict", "reason"),
    [
        ([b"lost"], "absent", "not in the stream: its event is not in lab/resolve (1 event read)"),
        (
            [b"lost-1", b"lost-2"],
            "absent",
            "not in the stream: none of its 2 events is in lab/resolve (1 event read)",
        ),
        (
            [b"already-there"],
            "in",
            "in the stream: its event is in lab/resolve (1 event read), byte for byte",
        ),
        (
            [b"already-there", b"lost"],
            "unknown",
            "cannot tell: 1 of its 2 events is in lab/resolve (1 event read)",
        ),
    ],
)
def test_a_finding_is_worded_for_its_count(store_uri, payloads, verdict, reason):
    record, rows = doubtful(payloads)
    [finding] = search(store_uri, [record], {record.txn_id: rows})
    assert finding.verdict == verdict
    assert finding.reason.startswith(reason), finding.reason


def test_a_stream_that_does_not_exist_holds_none_of_them(tmp_path):
    record, rows = doubtful([b"lost"])
    [finding] = search(f"embedded:{tmp_path / 'empty'}", [record], {record.txn_id: rows})
    assert (finding.verdict, finding.reason) == (
        "absent",
        "not in the stream: lab/resolve does not exist",
    )
