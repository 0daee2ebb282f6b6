"""How Sluice reaches a Pravega controller: URI, TLS trust, credentials, timeouts.

Everything is read once, when a store is opened, into a frozen `PravegaSettings`, from the URI
(`pravega://` or `tcp://` plain, `pravegas://` or `tls://` TLS) and the `SLUICE_PRAVEGA_*`
environment variables (ADAPTER.md lists them). Secrets never appear in a URI (one with
`user:password@` is refused: URIs end up in shell history, logs and Dagster run configs), in a
repr, or in an error message.
"""

from __future__ import annotations

import base64
import re
import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pipeline.streams.errors import StoreUnavailable, StreamStoreError

DEFAULT_PORT = 9090
_SCHEMES = {"pravega": False, "tcp": False, "pravegas": True, "tls": True}
_PEM_MARKER = b"-----BEGIN CERTIFICATE-----"
ClientLog = Literal["off", "error", "warn"]


class PravegaSettingsError(StreamStoreError, ValueError):
    """A Pravega setting is missing, malformed or unsafe; `setting` names the variable."""

    def __init__(self, reason: str, *, setting: str) -> None:
        self.setting, self.reason = setting, reason
        msg = f"Pravega setting {setting}: {reason}"
        super().__init__(msg)


@dataclass(frozen=True, slots=True)
class Credentials:
    """A user and password for Pravega's password auth handler (HTTP Basic)."""

    user: str
    password: str = field(repr=False)

    def basic_token(self) -> str:
        return base64.b64encode(f"{self.user}:{self.password}".encode()).decode("ascii")

    def secrets(self) -> tuple[str, ...]:
        """Strings that must never be shown: the password and the token derived from it."""
        return (self.password, self.basic_token())

    def __repr__(self) -> str:
        return f"Credentials(user={self.user!r}, password=<redacted>)"


@dataclass(frozen=True, slots=True)
class PravegaSettings:
    """Where the controller is and how to talk to it safely."""

    host: str
    port: int
    tls: bool
    truststore: Path | None = None
    credentials: Credentials | None = field(default=None, repr=False)
    connect_timeout: float = 5.0
    rpc_timeout: float = 30.0
    client_log: ClientLog = "off"

    @property
    def uri(self) -> str:
        """The URI as Sluice shows it: scheme, host and port, never a secret."""
        return f"{'pravegas' if self.tls else 'pravega'}://{self._netloc}"

    @property
    def controller_uri(self) -> str:
        """The URI in the form the Rust client parses (`tcp://` or `tls://`)."""
        return f"{'tls' if self.tls else 'tcp'}://{self._netloc}"

    @property
    def grpc_target(self) -> str:
        return self._netloc

    @property
    def _netloc(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def auth(self) -> str:
        return f"basic as {self.credentials.user}" if self.credentials else "none"

    def __repr__(self) -> str:
        return f"PravegaSettings(uri={self.uri!r}, tls={self.tls}, auth={self.auth!r})"

    def redact(self, text: str) -> str:
        """`text` with every secret of these settings, and anything shaped like one, masked."""
        if self.credentials:
            for secret in sorted(self.credentials.secrets(), key=len, reverse=True):
                text = text.replace(secret, "<redacted>")
        return _SECRET_SHAPES.sub(r"\1<redacted>", text)

    def trust_pems(self) -> list[bytes]:
        """The PEM certificates to trust, one per file; empty without TLS."""
        if not self.tls or self.truststore is None:
            return []
        return read_trust_pems(self.truststore)

    @classmethod
    def from_uri(cls, uri: str, environ: Mapping[str, str]) -> PravegaSettings:
        """Parse `uri` and the SLUICE_PRAVEGA_* variables of `environ`, refusing unsafe ones."""
        host, port, tls = parse_uri(uri)
        credentials = read_credentials(environ)
        if credentials and not tls and not _truthy(environ, "SLUICE_PRAVEGA_ALLOW_PLAINTEXT_AUTH"):
            msg = (
                "a password would travel unencrypted over pravega://: use pravegas:// (TLS), or "
                "set SLUICE_PRAVEGA_ALLOW_PLAINTEXT_AUTH=1 on a network you trust"
            )
            raise PravegaSettingsError(msg, setting="SLUICE_PRAVEGA_USER")
        return cls(
            host=host,
            port=port,
            tls=tls,
            truststore=_truststore(environ) if tls else None,
            credentials=credentials,
            connect_timeout=_seconds(environ, "SLUICE_PRAVEGA_CONNECT_TIMEOUT", 5.0),
            rpc_timeout=_seconds(environ, "SLUICE_PRAVEGA_RPC_TIMEOUT", 30.0),
            client_log=_client_log(environ),
        )


# `token: "..."`, `password=...`, `authorization: Basic ...`, `Basic <b64>` in client messages.
_SECRET_SHAPES = re.compile(
    r"(?i)((?:token|password|pwd|secret)[\"']?\s*[:=]\s*[\"']?|"
    r"authorization[\"']?\s*[:=]\s*[\"']?(?:basic|bearer)\s+|\b(?:basic|bearer)\s+)"
    r"[A-Za-z0-9+/=._\-]{4,}"
)


def redact_uri(uri: str) -> str:
    """`uri` with any `user:password@` part masked, for error messages."""
    return re.sub(r"//[^/@]*@", "//<redacted>@", str(uri))


def parse_uri(uri: str) -> tuple[str, int, bool]:
    """(host, port, tls) of a pravega://, pravegas://, tcp:// or tls:// URI."""
    shown = redact_uri(uri)
    try:
        parts = urlsplit(uri)
        port = parts.port or DEFAULT_PORT
    except ValueError as exc:
        msg = f"{shown!r} is not a valid URI ({exc})"
        raise PravegaSettingsError(msg, setting="URI") from None
    if parts.scheme not in _SCHEMES:
        msg = (
            f"{shown!r} has scheme {parts.scheme!r}: use pravega://, pravegas://, tcp:// or tls://"
        )
        raise PravegaSettingsError(msg, setting="URI")
    if parts.username is not None or parts.password is not None:
        msg = (
            f"{shown!r} carries credentials: put the user in SLUICE_PRAVEGA_USER and the "
            "password in a file named by SLUICE_PRAVEGA_PASSWORD_FILE"
        )
        raise PravegaSettingsError(msg, setting="URI")
    if not parts.hostname:
        msg = f"{shown!r} names no host: use pravega://HOST:9090"
        raise PravegaSettingsError(msg, setting="URI")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        msg = f"{shown!r} has a path, query or fragment: a controller URI is only host and port"
        raise PravegaSettingsError(msg, setting="URI")
    return parts.hostname, port, _SCHEMES[parts.scheme]


def read_credentials(environ: Mapping[str, str]) -> Credentials | None:
    user = environ.get("SLUICE_PRAVEGA_USER") or None
    path = environ.get("SLUICE_PRAVEGA_PASSWORD_FILE") or None
    password = _read_password_file(path) if path else environ.get("SLUICE_PRAVEGA_PASSWORD") or None
    if user is None and password is None:
        return None
    if user is None:
        msg = "a password is set but no user: set SLUICE_PRAVEGA_USER too"
        raise PravegaSettingsError(msg, setting="SLUICE_PRAVEGA_USER")
    if not password:
        msg = "a user is set but no password: set SLUICE_PRAVEGA_PASSWORD_FILE to a secret file"
        raise PravegaSettingsError(msg, setting="SLUICE_PRAVEGA_PASSWORD_FILE")
    if ":" in user:
        msg = "the user must not contain ':' (Basic auth separates user and password with it)"
        raise PravegaSettingsError(msg, setting="SLUICE_PRAVEGA_USER")
    return Credentials(user, password)


def _read_password_file(path: str) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        msg = f"cannot read the password file {path}: {reason}"
        raise PravegaSettingsError(msg, setting="SLUICE_PRAVEGA_PASSWORD_FILE") from None
    password = text.rstrip("\r\n")
    if not password:
        msg = f"the password file {path} is empty"
        raise PravegaSettingsError(msg, setting="SLUICE_PRAVEGA_PASSWORD_FILE")
    return password


def _truststore(environ: Mapping[str, str]) -> Path:
    """The configured trust store, else the system CA bundle; checked to hold certificates."""
    configured = environ.get("SLUICE_PRAVEGA_TRUSTSTORE")
    path = Path(configured) if configured else _system_ca_bundle()
    if path is None:
        msg = "pravegas:// needs the CA of the controller's certificate: set it to a PEM file"
        raise PravegaSettingsError(msg, setting="SLUICE_PRAVEGA_TRUSTSTORE")
    read_trust_pems(path)
    return path


def _system_ca_bundle() -> Path | None:
    cafile = ssl.get_default_verify_paths().cafile
    for candidate in (cafile, "/etc/ssl/certs/ca-certificates.crt"):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def read_trust_pems(path: Path) -> list[bytes]:
    """Each PEM file at `path` (a file, or the files of a directory) that holds a certificate."""
    if not path.exists():
        msg = f"{path} does not exist: point it at the CA certificate (PEM) of the cluster"
        raise PravegaSettingsError(msg, setting="SLUICE_PRAVEGA_TRUSTSTORE")
    files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
    pems = [data for data in (_read_bytes(p) for p in files) if _PEM_MARKER in data]
    if not pems:
        msg = f"{path} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
        raise PravegaSettingsError(msg, setting="SLUICE_PRAVEGA_TRUSTSTORE")
    return pems


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        msg = f"cannot read {path}: {exc.strerror}"
        raise PravegaSettingsError(msg, setting="SLUICE_PRAVEGA_TRUSTSTORE") from None


def _seconds(environ: Mapping[str, str], name: str, default: float) -> float:
    text = environ.get(name)
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 3600:
        msg = f"{text!r} is not a number of seconds in (0, 3600]"
        raise PravegaSettingsError(msg, setting=name)
    return value


def _client_log(environ: Mapping[str, str]) -> ClientLog:
    """The Rust client's log level, capped at warn: at info and below it prints its whole
    configuration, credentials token included, to stdout."""
    level = (environ.get("SLUICE_PRAVEGA_CLIENT_LOG") or "off").lower()
    if level not in ("off", "error", "warn"):
        msg = f"{level!r} is not off, error or warn (more verbose levels print credentials)"
        raise PravegaSettingsError(msg, setting="SLUICE_PRAVEGA_CLIENT_LOG")
    return level  # type: ignore[return-value]


def _truthy(environ: Mapping[str, str], name: str) -> bool:
    return (environ.get(name) or "").strip().lower() in ("1", "true", "yes", "on")


def probe(settings: PravegaSettings) -> None:
    """Fail fast with `StoreUnavailable` when nothing answers on the controller's port.

    The Rust client retries a refused connection for about a minute while holding the GIL
    (11 tries, back-off up to 10 s); a plain TCP connect with `connect_timeout` answers at once.
    """
    where = f"{settings.host}:{settings.port}"
    try:
        with socket.create_connection((settings.host, settings.port), settings.connect_timeout):
            return
    except ConnectionRefusedError:
        reason = f"nothing listens on {where} (connection refused): start the Pravega controller"
    except TimeoutError:
        reason = f"no answer from {where} within {settings.connect_timeout:g} s: check the firewall"
    except socket.gaierror as exc:
        reason = f"cannot resolve host {settings.host!r} ({exc.strerror}): check the URI"
    except OSError as exc:
        reason = f"cannot connect to {where}: {exc.strerror or exc}"
    raise StoreUnavailable(settings.uri, reason)
