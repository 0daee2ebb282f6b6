"""The embedded stream store (the default backend): see FORMAT.md for the on-disk format."""

from pipeline.streams.embedded.store import EmbeddedStore

__all__ = ["EmbeddedStore"]
