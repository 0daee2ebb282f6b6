"""Transaction ids of the embedded store that carry their own `open` row.

`begin` writes nothing to the catalog: the id is the `open` row, recorded by the first catalog
write about the transaction (a flush, its commit, an abort). The id holds the random part,
the creation time and the lease expiry, sealed with a keyed BLAKE2b over them and the stream's
id (the key is the store id), so `get_transaction(stream, id)` can tell an id this store issued
for this stream from any other string and read its row from it: `open`, nothing flushed. That
is all a transaction without a row can be, also after a power cut: a flush records its row and
body with synchronous=FULL; an abort is FULL too; a one-segment commit's block recreates the
row `committed` (`index.commit_landed`); a commit over several segments is `committing`
(FULL) before anything lands.

    id = uuid4 hex (32) | created_ns (16 hex) | lease_expiry_ns (16 hex) | seal (16 hex)

Ids from before (a bare uuid4 hex) always had their row written with synchronous=FULL.
"""

from __future__ import annotations

import hashlib
import uuid

_RANDOM, _TIME, _SEAL = 32, 16, 16
ID_LENGTH = _RANDOM + 2 * _TIME + _SEAL
_LAST_NS = 2**63 - 1


def issue(store_id: str, stream_id: int, created_ns: int, expiry_ns: int) -> str:
    """A new transaction id for `stream_id` of the store `store_id`."""
    body = f"{uuid.uuid4().hex}{created_ns:016x}{min(expiry_ns, _LAST_NS):016x}"
    return body + _seal(store_id, stream_id, body)


def begin_row(store_id: str, stream_id: int, txn_id: str) -> tuple[int, int] | None:
    """(created_ns, lease_expiry_ns) of an id this store issued for this stream, else None."""
    if len(txn_id) != ID_LENGTH or not txn_id.isascii():
        return None
    body, seal = txn_id[:-_SEAL], txn_id[-_SEAL:]
    if seal != _seal(store_id, stream_id, body):
        return None
    times = body[_RANDOM:]
    return int(times[:_TIME], 16), int(times[_TIME:], 16)


def _seal(store_id: str, stream_id: int, body: str) -> str:
    digest = hashlib.blake2b(
        f"{stream_id}:{body}".encode(), key=store_id.encode()[:64], digest_size=_SEAL // 2
    )
    return digest.hexdigest()
