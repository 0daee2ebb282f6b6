"""The instance's persistent buffer: one SQLite file between its driver and its sender.

`queue.py` holds the events (`Buffer`), `ledger.py` the stream transactions that may hold
some of them (`TxnLedger`), `status.py` the counters, errors and meta that `sluice collect
status` shows; `file.py` is the connection they share and `schema.py` the declared schema.
The file format is described in FORMAT.md next to this file.
"""

from collectors.buffer.file import BufferFile, WriteTurns, connect
from collectors.buffer.ledger import PROMISED_UP_TO, Held, TxnLedger, held
from collectors.buffer.queue import Appended, Buffer, TxnHook, WhenFull

__all__ = [
    "PROMISED_UP_TO",
    "Appended",
    "Buffer",
    "BufferFile",
    "Held",
    "TxnHook",
    "TxnLedger",
    "WhenFull",
    "WriteTurns",
    "connect",
    "held",
]
