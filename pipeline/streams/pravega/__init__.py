"""The Pravega backend of the stream store: `open_store("pravega://host:9090")`.

`PravegaStore` (store.py) says what works on Pravega through the `pravega` Python client and
what raises `Unsupported`; settings.py how to connect (TLS, credentials, timeouts); ADAPTER.md
why each limit is there and what Sluice does about it.
"""

from pipeline.streams.pravega.client import PravegaClientError
from pipeline.streams.pravega.settings import Credentials, PravegaSettings, PravegaSettingsError
from pipeline.streams.pravega.store import PravegaStore

__all__ = [
    "Credentials",
    "PravegaClientError",
    "PravegaSettings",
    "PravegaSettingsError",
    "PravegaStore",
]
