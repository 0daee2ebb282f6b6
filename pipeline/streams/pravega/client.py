"""The `pravega` package (module `pravega_client`, a Rust client) behind a typed, quiet front.

- `client_environment()` builds the client's manager with exactly Sluice's credentials and trust
  store in the process environment (where the client reads them), under a lock, and restores it.
- `guard()` turns the client's `ValueError`/`OSError`s and Rust panics into Sluice's typed
  errors, with secrets masked.
- `import_client()` imports it with Sluice's log level (off by default, at most warn), since it
  logs to stdout; its objects (whose repr holds the Basic token) are never repr'd here.
Why each is needed: ADAPTER.md ("The client package").
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import TypeVar

from pipeline.streams.errors import (
    ScopeNotFound,
    StoreUnavailable,
    StreamNotFound,
    StreamNotSealed,
    StreamSealed,
    StreamStoreError,
)
from pipeline.streams.pravega.settings import PravegaSettings

T = TypeVar("T")

#: Guards os.environ while the Rust client reads it: the environment is one per process.
_ENV_LOCK = threading.Lock()
_CLIENT_ENV_PREFIX = "pravega_client_"


class PravegaClientError(StreamStoreError):
    """The Pravega client failed in a way Sluice has no narrower error for."""

    def __init__(self, detail: str, *, operation: str) -> None:
        self.operation, self.detail = operation, detail
        msg = (
            f"Pravega {operation} failed: {detail} "
            "(see docker/README.md, 'Pravega', for what the Python client can and cannot do)"
        )
        super().__init__(msg)


def import_client(settings: PravegaSettings) -> ModuleType:
    """`pravega_client`, imported (the first time) with its log level set from `settings`."""
    with _ENV_LOCK:
        previous = os.environ.get("RUST_LOG")
        os.environ["RUST_LOG"] = settings.client_log
        try:
            import pravega_client
        except ImportError:
            msg = (
                "the `pravega` package is not installed: install Sluice with the `pravega` "
                "extra (uv sync --extra pravega; it ships wheels for CPython 3.11)"
            )
            raise StoreUnavailable(settings.uri, msg) from None
        finally:
            _restore("RUST_LOG", previous)
    return pravega_client


def build_manager(settings: PravegaSettings) -> object:
    """A `pravega_client.StreamManager` for `settings`, credentials and trust applied."""
    client = import_client(settings)
    with _ENV_LOCK, client_environment(settings):
        return guard(
            settings,
            "connect",
            lambda: client.StreamManager(
                settings.controller_uri, settings.credentials is not None, settings.tls
            ),
        )


@contextmanager
def client_environment(settings: PravegaSettings) -> Iterator[dict[str, str]]:
    """Set the client's environment variables for `settings`; restore everything after.

    Any `pravega_client_*` variable already in the environment is hidden meanwhile, so that
    only Sluice's settings apply. The trust store is copied into a private temporary
    directory because the client reads every file of a directory as a certificate.
    """
    saved = {k: v for k, v in os.environ.items() if k.startswith(_CLIENT_ENV_PREFIX)}
    wanted: dict[str, str] = {}
    certs_dir = None
    if settings.credentials is not None:
        wanted["pravega_client_auth_method"] = "Basic"
        wanted["pravega_client_auth_username"] = settings.credentials.user
        wanted["pravega_client_auth_password"] = settings.credentials.password
    if settings.tls:
        certs_dir = Path(tempfile.mkdtemp(prefix="sluice-pravega-trust-"))
        for i, pem in enumerate(settings.trust_pems()):
            (certs_dir / f"ca-{i}.pem").write_bytes(pem)
        wanted["pravega_client_tls_cert_path"] = str(certs_dir)
    try:
        for key in saved:
            del os.environ[key]
        os.environ.update(wanted)
        yield wanted
    finally:
        for key in wanted:
            os.environ.pop(key, None)
        os.environ.update(saved)
        if certs_dir is not None:
            shutil.rmtree(certs_dir, ignore_errors=True)


def _restore(key: str, previous: str | None) -> None:
    if previous is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = previous


def guard(
    settings: PravegaSettings,
    operation: str,
    call: Callable[[], T],
    stream: tuple[str, str] | None = None,
) -> T:
    """Run one client call; turn whatever it raises into a typed Sluice error."""
    try:
        return call()
    except (KeyboardInterrupt, SystemExit, GeneratorExit, StreamStoreError):
        raise
    except BaseException as exc:  # Rust panics arrive as BaseException
        raise translate(settings, operation, exc, stream) from None


def translate(
    settings: PravegaSettings,
    operation: str,
    exc: BaseException,
    stream: tuple[str, str] | None = None,
) -> StreamStoreError:
    """The typed error for a client failure; the client's text is kept, secrets masked."""
    raw = str(exc) or type(exc).__name__
    detail, lowered = settings.redact(raw), raw.lower()
    if type(exc).__name__ == "PanicException":
        return PravegaClientError(f"the client panicked: {detail}", operation=operation)
    if _any(lowered, "authtokencheckfailed", "unauthenticated", "permissiondenied", "401", "403"):
        reason = (
            f"{operation} was refused by the cluster ({detail}): check SLUICE_PRAVEGA_USER "
            "and the password file, and the user's ACL"
        )
        return StoreUnavailable(settings.uri, reason)
    if _any(lowered, "connectionerror", "transport error", "connection refused", "timed out"):
        reason = f"{operation} could not reach the cluster: {detail}"
        return StoreUnavailable(settings.uri, reason)
    if stream is not None:
        typed = _stream_error(lowered, *stream)
        if typed is not None:
            return typed
    return PravegaClientError(detail, operation=operation)


def _stream_error(lowered: str, scope: str, name: str) -> StreamStoreError | None:
    if _any(lowered, "scope_not_found", "scopenotfound", "scope does not exist"):
        return ScopeNotFound(scope)
    if _any(lowered, "stream_not_found", "streamnotfound", "stream does not exist"):
        return StreamNotFound(scope, name)
    if _any(lowered, "stream_not_sealed", "not sealed"):
        return StreamNotSealed(scope, name)
    if _any(lowered, "sealed"):
        return StreamSealed(scope, name)
    return None


def _any(text: str, *needles: str) -> bool:
    return any(n in text for n in needles)
