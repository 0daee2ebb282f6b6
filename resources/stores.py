"""The stream stores as a Dagster resource: the stores of `[stores.*]`, opened when first used.

A thin wrapper: `uri(name)` for jobs that open the store themselves (Spark executors each open
their own), `open(name)` for reading cuts and counts on the driver. Opened stores are live
handles kept in a private attribute and closed after the step, so a resource object can be
configured, validated and shown in the UI without touching the disk.
"""

from __future__ import annotations

import dagster as dg
from pydantic import PrivateAttr, field_validator

from pipeline.config import checked_store_uri
from pipeline.errors import SluiceError
from pipeline.streams import StreamStore, open_store


class UnknownStore(SluiceError, LookupError):
    def __init__(self, name: str, known: list[str]) -> None:
        self.name, self.known = name, known
        configured = ", ".join(known) or "none"
        msg = (
            f"no store named {name!r} (configured: {configured}): "
            f"add [stores.{name}] to sluice.toml"
        )
        super().__init__(msg)


class StreamStoresResource(dg.ConfigurableResource):
    """The configured stream stores by name (`edge`, `cloud`, ...) and their URIs."""

    uris: dict[str, str]

    _open: dict[str, StreamStore] = PrivateAttr(default_factory=dict)

    @field_validator("uris")
    @classmethod
    def _store_uris(cls, uris: dict[str, str]) -> dict[str, str]:
        """Refuse a text that is not a store URI when the resource is built (the run's start,
        for run config from the launchpad), not when a step first opens the store."""
        return {name: checked_store_uri(uri, f"stores.uris.{name}") for name, uri in uris.items()}

    def uri(self, name: str) -> str:
        if name not in self.uris:
            raise UnknownStore(name, sorted(self.uris))
        return self.uris[name]

    def open(self, name: str) -> StreamStore:
        """The store `name`, opened on first use and kept open until the step ends."""
        if name not in self._open:
            self._open[name] = open_store(self.uri(name))
        return self._open[name]

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        for store in self._open.values():
            store.close()
        self._open.clear()
