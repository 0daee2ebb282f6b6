"""The stream store: one API (`StreamStore`), two backends chosen by URI.

open_store("embedded:/var/lib/sluice/streams")   # the default, on local disk
open_store("pravega://controller:9090")          # a Pravega cluster (pravegas:// for TLS)

A new backend is a package beside `embedded/` and `pravega/` that implements `api.py`'s
`StreamStore`, is chosen by its URI scheme in `open_store`, and passes the contract suite
`tests/streams/test_contract.py`.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.streams.api import EventReader, EventWriter, ReaderGroup, StreamStore, Transaction
from pipeline.streams.cut import StreamCut, as_cut
from pipeline.streams.errors import (
    CatalogDamaged,
    CatalogMismatch,
    CatalogUnusable,
    Corrupted,
    CutStreamMismatch,
    EventTooLarge,
    InvalidArgument,
    InvalidCut,
    InvalidEventNumber,
    InvalidName,
    InvalidRoutingKey,
    NoStore,
    ReaderGroupConflict,
    ReaderGroupNotFound,
    ReaderOffline,
    ScopeNotFound,
    SegmentDamaged,
    SegmentNotActive,
    StaleCut,
    StoreFormatTooNew,
    StoreFull,
    StoreUnavailable,
    StreamNotFound,
    StreamNotSealed,
    StreamSealed,
    StreamStoreError,
    Truncated,
    TxnFailed,
    TxnNotFound,
    Unsupported,
)
from pipeline.streams.names import parse_stream
from pipeline.streams.values import (
    DEFAULT_TXN_LEASE_SECONDS,
    MAX_EVENT_SIZE,
    Event,
    EventBatch,
    Problem,
    Progress,
    RepairReport,
    Retention,
    ScalingPolicy,
    SegmentInfo,
    StreamInfo,
    TxnState,
    VerifyReport,
)

__all__ = [
    "DEFAULT_TXN_LEASE_SECONDS",
    "MAX_EVENT_SIZE",
    "CatalogDamaged",
    "CatalogMismatch",
    "CatalogUnusable",
    "Corrupted",
    "CutStreamMismatch",
    "Event",
    "EventBatch",
    "EventReader",
    "EventTooLarge",
    "EventWriter",
    "InvalidArgument",
    "InvalidCut",
    "InvalidEventNumber",
    "InvalidName",
    "InvalidRoutingKey",
    "NoStore",
    "Problem",
    "Progress",
    "ReaderGroup",
    "ReaderGroupConflict",
    "ReaderGroupNotFound",
    "ReaderOffline",
    "RepairReport",
    "Retention",
    "ScalingPolicy",
    "ScopeNotFound",
    "SegmentDamaged",
    "SegmentInfo",
    "SegmentNotActive",
    "StaleCut",
    "StoreFormatTooNew",
    "StoreFull",
    "StoreUnavailable",
    "StreamCut",
    "StreamInfo",
    "StreamNotFound",
    "StreamNotSealed",
    "StreamSealed",
    "StreamStore",
    "StreamStoreError",
    "Transaction",
    "Truncated",
    "TxnFailed",
    "TxnNotFound",
    "TxnState",
    "Unsupported",
    "VerifyReport",
    "as_cut",
    "open_store",
    "parse_stream",
]


def open_store(uri: str | None = None, *, must_exist: bool = False) -> StreamStore:
    """Open the store named by `uri` (default: `$SLUICE_STORE`, else the embedded store
    under `$SLUICE_HOME/streams`). An embedded store is created where none is, unless
    `must_exist` (for what only looks at a store: a misspelt path leaves no new store behind;
    `NoStore` instead)."""
    from pipeline.config import default_store_uri

    uri = uri or default_store_uri()
    scheme, _, rest = uri.partition(":")
    if scheme == "embedded":
        from pipeline.streams.embedded import EmbeddedStore

        directory = rest or default_store_uri().partition(":")[2]
        if must_exist and not Path(directory).expanduser().exists():
            raise NoStore(uri, directory)
        return EmbeddedStore(directory)
    if scheme in ("pravega", "pravegas", "tcp", "tls"):
        from pipeline.streams.pravega import PravegaStore

        return PravegaStore(uri)
    msg = f"unknown store URI {uri!r}: use embedded:<dir> or pravega://host:9090"
    raise StoreUnavailable(uri, msg)
