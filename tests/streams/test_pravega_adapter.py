"""The Pravega adapter, everything that does not need a Pravega server.

The server-backed contract runs in test_contract.py when SLUICE_TEST_PRAVEGA is set. Here:
URI and security settings, the client's environment handling, error translation (with a real
client panic), the closed-port path on a real closed loopback port, the controller RPCs against
an in-process gRPC server speaking Pravega's controller messages (with real TLS), transaction
state logic, and frame parsing of segment bytes in Pravega's event framing.
"""

from __future__ import annotations

import base64
import io
import itertools
import os
import re
import socket
import struct
import subprocess
import uuid
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from pipeline.streams import (
    MAX_EVENT_SIZE,
    EventTooLarge,
    InvalidCut,
    InvalidName,
    Retention,
    StoreUnavailable,
    StreamCut,
    StreamNotFound,
    TxnFailed,
    TxnNotFound,
    Unsupported,
    open_store,
)
from pipeline.streams.pravega import (
    PravegaClientError,
    PravegaSettings,
    PravegaSettingsError,
    frames,
)
from pipeline.streams.pravega.client import build_manager, client_environment, guard, translate
from pipeline.streams.pravega.controller import SERVICE, ControllerChannel, messages, txn_id_bits
from pipeline.streams.pravega.retention import policy_for, retention_from_tags
from pipeline.streams.pravega.settings import probe, redact_uri
from pipeline.streams.pravega.transactions import (
    PravegaTransaction,
    format_txn_id,
    parse_txn_id,
)

pravega_client = pytest.importorskip("pravega_client")
PASSWORD = "s3cret-Pa55"


def settings(uri: str = "pravega://127.0.0.1:9090", **env: str) -> PravegaSettings:
    return PravegaSettings.from_uri(uri, env)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def listening_port():
    """A loopback port that accepts TCP connections (and answers nothing)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield s.getsockname()[1]


@pytest.fixture
def password_file(tmp_path) -> Path:
    path = tmp_path / "pravega-password"
    path.write_text(PASSWORD + "\n")
    return path


# --- URI and settings ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "host", "port", "tls"),
    [
        ("pravega://controller:9090", "controller", 9090, False),
        ("tcp://10.0.0.5:9191", "10.0.0.5", 9191, False),
        ("pravegas://pravega.example.org", "pravega.example.org", 9090, True),
        ("tls://[::1]:9090/", "::1", 9090, True),
    ],
)
def test_uri_forms(uri, host, port, tls):
    s = settings(uri)
    assert (s.host, s.port, s.tls) == (host, port, tls)
    assert s.controller_uri.startswith("tls://" if tls else "tcp://")
    assert s.uri.startswith("pravegas://" if tls else "pravega://")


@pytest.mark.parametrize(
    ("uri", "reason"),
    [
        ("http://h:9090", "has scheme 'http'"),
        ("pravega://:9090", "names no host"),
        ("pravega://h:9090/scope", "has a path"),
        ("pravega://h:9090?x=1", "has a path, query"),
        ("pravega://h:99999", "not a valid URI"),
    ],
)
def test_bad_uris_are_refused(uri, reason):
    with pytest.raises(PravegaSettingsError, match=re.escape(reason)) as err:
        settings(uri)
    assert err.value.setting == "URI"


def test_credentials_in_the_uri_are_refused_without_echoing_them():
    with pytest.raises(PravegaSettingsError, match="SLUICE_PRAVEGA_PASSWORD_FILE") as err:
        settings(f"pravegas://admin:{PASSWORD}@h:9090")
    assert PASSWORD not in str(err.value)
    assert redact_uri(f"pravegas://admin:{PASSWORD}@h:9090") == "pravegas://<redacted>@h:9090"


def test_password_from_file_never_shown(password_file):
    s = settings(
        "pravegas://h:9090",
        SLUICE_PRAVEGA_USER="admin",
        SLUICE_PRAVEGA_PASSWORD_FILE=str(password_file),
    )
    assert s.credentials is not None
    assert s.credentials.password == PASSWORD  # trailing newline of the secret file dropped
    token = base64.b64encode(f"admin:{PASSWORD}".encode()).decode()
    for shown in (repr(s), str(s), repr(s.credentials)):
        assert PASSWORD not in shown
        assert token not in shown
    assert s.auth == "basic as admin"
    leaked = f"ClientConfig {{ credentials: Basic {{ token: {token!r} }} }} pw={PASSWORD}"
    assert PASSWORD not in s.redact(leaked)
    assert token not in s.redact(leaked)


def test_password_over_plaintext_is_refused_unless_allowed(password_file):
    env = {"SLUICE_PRAVEGA_USER": "admin", "SLUICE_PRAVEGA_PASSWORD_FILE": str(password_file)}
    with pytest.raises(PravegaSettingsError, match="unencrypted"):
        settings("pravega://h:9090", **env)
    allowed = settings("pravega://h:9090", SLUICE_PRAVEGA_ALLOW_PLAINTEXT_AUTH="1", **env)
    assert allowed.credentials is not None


@pytest.mark.parametrize(
    ("env", "setting", "reason"),
    [
        ({"SLUICE_PRAVEGA_PASSWORD": "x"}, "SLUICE_PRAVEGA_USER", "no user"),
        ({"SLUICE_PRAVEGA_USER": "a"}, "SLUICE_PRAVEGA_PASSWORD_FILE", "no password"),
        (
            {"SLUICE_PRAVEGA_USER": "a:b", "SLUICE_PRAVEGA_PASSWORD": "x"},
            "SLUICE_PRAVEGA_USER",
            ":",
        ),
        (
            {"SLUICE_PRAVEGA_USER": "a", "SLUICE_PRAVEGA_PASSWORD_FILE": "/nonexistent/pw"},
            "SLUICE_PRAVEGA_PASSWORD_FILE",
            "cannot read the password file /nonexistent/pw",
        ),
        ({"SLUICE_PRAVEGA_CONNECT_TIMEOUT": "soon"}, "SLUICE_PRAVEGA_CONNECT_TIMEOUT", "seconds"),
        ({"SLUICE_PRAVEGA_CLIENT_LOG": "debug"}, "SLUICE_PRAVEGA_CLIENT_LOG", "print credentials"),
        (
            {"SLUICE_PRAVEGA_TRUSTSTORE": "/nonexistent/ca.pem"},
            "SLUICE_PRAVEGA_TRUSTSTORE",
            "exist",
        ),
    ],
)
def test_bad_settings_name_the_variable(env, setting, reason):
    env = {"SLUICE_PRAVEGA_ALLOW_PLAINTEXT_AUTH": "1", **env}
    uri = "pravegas://h:9090" if "TRUSTSTORE" in setting else "pravega://h:9090"
    with pytest.raises(PravegaSettingsError, match=re.escape(reason)) as err:
        settings(uri, **env)
    assert err.value.setting == setting


def test_empty_password_file_is_refused(tmp_path):
    empty = tmp_path / "pw"
    empty.write_text("\n")
    env = {"SLUICE_PRAVEGA_USER": "a", "SLUICE_PRAVEGA_PASSWORD_FILE": str(empty)}
    with pytest.raises(PravegaSettingsError, match="is empty"):
        settings("pravegas://h:9090", **env)


def test_truststore_file_or_directory(tmp_path, pki):
    not_a_cert = tmp_path / "notes.txt"
    not_a_cert.write_text("hello")
    with pytest.raises(PravegaSettingsError, match="no PEM certificate"):
        settings("pravegas://h:9090", SLUICE_PRAVEGA_TRUSTSTORE=str(not_a_cert))
    assert settings("pravegas://h:9090", SLUICE_PRAVEGA_TRUSTSTORE=str(pki["ca"])).trust_pems()
    directory = tmp_path / "trust"
    directory.mkdir()
    (directory / "ca.pem").write_bytes(pki["ca"].read_bytes())
    (directory / "README").write_text("not a certificate, skipped")
    s = settings("pravegas://h:9090", SLUICE_PRAVEGA_TRUSTSTORE=str(directory))
    assert len(s.trust_pems()) == 1


# --- the Rust client: environment, panics, error translation ----------------------------


def test_client_environment_is_set_only_while_building(password_file, pki, monkeypatch):
    monkeypatch.setenv("pravega_client_auth_method", "Bearer")  # a stray setting, hidden meanwhile
    s = settings(
        "pravegas://127.0.0.1:9090",
        SLUICE_PRAVEGA_USER="admin",
        SLUICE_PRAVEGA_PASSWORD_FILE=str(password_file),
        SLUICE_PRAVEGA_TRUSTSTORE=str(pki["ca"]),
    )
    with client_environment(s) as wanted:
        assert os.environ["pravega_client_auth_method"] == "Basic"
        assert os.environ["pravega_client_auth_password"] == PASSWORD
        cert_dir = Path(os.environ["pravega_client_tls_cert_path"])
        assert [p.read_bytes() for p in cert_dir.iterdir()] == [pki["ca"].read_bytes()]
    assert "pravega_client_auth_password" not in os.environ
    assert os.environ["pravega_client_auth_method"] == "Bearer"
    assert not cert_dir.exists()
    assert set(wanted) >= {"pravega_client_auth_username", "pravega_client_tls_cert_path"}


def test_real_client_builds_with_tls_and_auth_and_leaves_no_secret(password_file, pki):
    s = settings(
        "pravegas://127.0.0.1:9090",
        SLUICE_PRAVEGA_USER="admin",
        SLUICE_PRAVEGA_PASSWORD_FILE=str(password_file),
        SLUICE_PRAVEGA_TRUSTSTORE=str(pki["ca"]),
    )
    manager = build_manager(s)  # builds the client config; no connection yet
    assert manager is not None
    assert not any(k.startswith("pravega_client_") for k in os.environ)
    assert PASSWORD not in "\n".join(os.environ.values())


def test_a_client_panic_becomes_a_typed_error():
    s = settings()
    with pytest.raises(PravegaClientError, match="the client panicked") as err:
        guard(s, "connect", lambda: pravega_client.StreamManager("not a uri", False, False))
    assert err.value.operation == "connect"


@pytest.mark.parametrize(
    ("text", "kind", "needle"),
    [
        (
            'RetryError { error: ConnectionError { can_retry: true, error_msg: "status: Unknown, '
            'message: \\"transport error\\"" }, total_delay: 61.111s, tries: 11 }',
            StoreUnavailable,
            "could not reach the cluster",
        ),
        ('OperationError { error_msg: "AuthTokenCheckFailed" }', StoreUnavailable, "refused"),
        ("CreateStream failed: ScopeNotFound", Exception, "scope 'sc' does not exist"),
        ('StreamNotFound { stream: "st" }', StreamNotFound, "stream sc/st does not exist"),
        ("delete failed: STREAM_NOT_SEALED", Exception, "must be sealed"),
        ("Write timed out, please check connectivity with Pravega.", StoreUnavailable, "reach"),
        ("something new", PravegaClientError, "something new"),
    ],
)
def test_client_errors_are_translated(text, kind, needle):
    error = translate(settings(), "do it", ValueError(text), ("sc", "st"))
    assert isinstance(error, kind)
    assert needle in str(error)


def test_translated_errors_mask_secrets(password_file):
    s = settings(
        "pravega://h:9090",
        SLUICE_PRAVEGA_USER="admin",
        SLUICE_PRAVEGA_PASSWORD_FILE=str(password_file),
        SLUICE_PRAVEGA_ALLOW_PLAINTEXT_AUTH="1",
    )
    token = s.credentials.basic_token()
    error = translate(s, "x", ValueError(f"failed with token {token} and password {PASSWORD}"))
    assert PASSWORD not in str(error)
    assert token not in str(error)


# --- a closed port, an open one ----------------------------------------------------------


@pytest.mark.timeout(30)  # the client alone would retry for about a minute
def test_closed_port_is_unavailable_at_once(password_file, monkeypatch):
    monkeypatch.setenv("SLUICE_PRAVEGA_USER", "admin")
    monkeypatch.setenv("SLUICE_PRAVEGA_PASSWORD_FILE", str(password_file))
    monkeypatch.setenv("SLUICE_PRAVEGA_ALLOW_PLAINTEXT_AUTH", "1")
    port = closed_port()
    with pytest.raises(StoreUnavailable, match="connection refused") as err:
        open_store(f"pravega://127.0.0.1:{port}")
    assert f"127.0.0.1:{port}" in str(err.value)
    assert PASSWORD not in str(err.value)


@pytest.mark.timeout(30)
def test_unanswered_connect_times_out(monkeypatch):
    # 192.0.2.0/24 is TEST-NET-1: never routed, so a connect gets no answer (or is refused)
    s = settings("pravega://192.0.2.1:9090", SLUICE_PRAVEGA_CONNECT_TIMEOUT="0.5")
    with pytest.raises(StoreUnavailable, match=r"192\.0\.2\.1:9090"):
        probe(s)


@pytest.fixture
def store(listening_port):
    """A store whose controller port answers TCP; only calls that need no RPC may be made."""
    s = open_store(f"tcp://127.0.0.1:{listening_port}")
    yield s
    s.close()


def test_store_repr_shows_no_secret(listening_port, password_file, monkeypatch):
    monkeypatch.setenv("SLUICE_PRAVEGA_USER", "admin")
    monkeypatch.setenv("SLUICE_PRAVEGA_PASSWORD_FILE", str(password_file))
    monkeypatch.setenv("SLUICE_PRAVEGA_ALLOW_PLAINTEXT_AUTH", "1")
    s = open_store(f"pravega://127.0.0.1:{listening_port}")
    assert (
        repr(s)
        == f"PravegaStore('pravega://127.0.0.1:{listening_port}', tls=False, auth='basic as admin')"
    )
    assert s.uri == f"pravega://127.0.0.1:{listening_port}"


@pytest.mark.parametrize("name", ["s/under_score", "_sys/x", "s/" + "n" * 251, "../x", "a/b/c"])
def test_names_pravega_refuses_are_refused_first(store, name):
    with pytest.raises(InvalidName):
        store.create_stream(name)


def test_unsupported_features_say_what_to_do(store):
    with pytest.raises(Unsupported, match="transaction"):
        store.writer("sc/st", writer_id="edge-1")
    with pytest.raises(Unsupported, match="record cuts while writing"):
        store.time_cuts("sc/st", 0, 10)
    with pytest.raises(Unsupported, match=re.escape("read(stream, start, end)")):
        store.reader_group("rg", "sc/st")
    with pytest.raises(Unsupported, match="one retention policy"):
        store.create_stream("sc/st", retention=Retention(max_bytes=10, max_age_seconds=60))
    with pytest.raises(ValueError, match="1 to 1024 segments"):
        store.create_stream("sc/st", segments=0)


# --- controller RPCs against an in-process gRPC server -----------------------------------


class FakeController:
    """Pravega's controller service, for the three RPCs Sluice makes itself."""

    def __init__(self) -> None:
        self.txns: dict[tuple[int, int], int] = {}
        self.segments: list[tuple[int, float, float]] = []
        self.truncate_status = 0
        self.truncated: dict[int, int] = {}
        self.metadata: list[dict[str, str]] = []
        self.refuse_auth = False

    def handler(self) -> grpc.GenericRpcHandler:
        m = messages()

        def unary(fn, request, reply):
            return grpc.unary_unary_rpc_method_handler(
                fn,
                request_deserializer=m[request].FromString,
                response_serializer=lambda r: r.SerializeToString(),
            )

        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "checkTransactionState": unary(self.check, "TxnRequest", "TxnState"),
                "getCurrentSegments": unary(self.current, "StreamInfo", "SegmentRanges"),
                "truncateStream": unary(self.truncate, "StreamCut", "UpdateStreamStatus"),
            },
        )

    def _seen(self, context) -> None:
        self.metadata.append(dict(context.invocation_metadata()))
        if self.refuse_auth:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "bad credentials")

    def check(self, request, context):
        self._seen(context)
        key = (request.txnId.highBits, request.txnId.lowBits)
        return messages()["TxnState"](state=self.txns.get(key, 0))

    def current(self, request, context):
        self._seen(context)
        m = messages()
        ranges = [
            m["SegmentRange"](
                segmentId=m["SegmentId"](streamInfo=request, segmentId=seg), minKey=lo, maxKey=hi
            )
            for seg, lo, hi in self.segments
        ]
        return m["SegmentRanges"](segmentRanges=ranges)

    def truncate(self, request, context):
        self._seen(context)
        self.truncated = dict(request.cut)
        return messages()["UpdateStreamStatus"](status=self.truncate_status)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, Path]:
    """A CA and a server certificate for 127.0.0.1 and localhost, made with openssl."""
    d = tmp_path_factory.mktemp("pki")

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    for ca in ("ca", "other-ca"):
        run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}.key", "-out",
            f"{ca}.pem", "-days", "2", "-subj", f"/CN={ca}",
            "-addext", "basicConstraints=critical,CA:TRUE")  # fmt: skip
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
        "-subj", "/CN=localhost")  # fmt: skip
    (d / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "san.ext")  # fmt: skip
    return {n: d / f"{n}.pem" for n in ("ca", "other-ca", "server")} | {"key": d / "server.key"}


@pytest.fixture
def controller():
    fake = FakeController()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((fake.handler(),))
    fake.port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield fake
    server.stop(None)


@pytest.fixture
def tls_controller(pki):
    fake = FakeController()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((fake.handler(),))
    creds = grpc.ssl_server_credentials([(pki["key"].read_bytes(), pki["server"].read_bytes())])
    fake.port = server.add_secure_port("127.0.0.1:0", creds)
    server.start()
    yield fake
    server.stop(None)


def channel_for(port: int, uri: str = "pravega", **env: str) -> ControllerChannel:
    return ControllerChannel(settings(f"{uri}://127.0.0.1:{port}", **env))


def test_transaction_state_is_exact(controller):
    txn_id = uuid.uuid4().int
    controller.txns[txn_id_bits(txn_id)] = 3
    channel = channel_for(controller.port)
    assert channel.txn_state("sc", "st", txn_id) == "committed"
    controller.txns[txn_id_bits(txn_id)] = 5
    assert channel.txn_state("sc", "st", txn_id) == "aborted"
    assert channel.txn_state("sc", "st", uuid.uuid4().int) == "unknown"
    channel.close()


def test_current_segments_and_truncation(controller):
    controller.segments = [(4294967297, 0.5, 1.0), (4294967296, 0.0, 0.5)]
    channel = channel_for(controller.port)
    got = channel.current_segments("sc", "st")
    assert [(r.segment, r.key_range) for r in got] == [
        (4294967296, (0.0, 0.5)),
        (4294967297, (0.5, 1.0)),
    ]
    channel.truncate("sc", "st", {4294967296: 1024})
    assert controller.truncated == {4294967296: 1024}
    controller.truncate_status = 2
    with pytest.raises(StreamNotFound):
        channel.truncate("sc", "st", {0: 8})
    controller.truncate_status = 1
    with pytest.raises(PravegaClientError, match="answered FAILURE"):
        channel.truncate("sc", "st", {0: 8})


def test_credentials_travel_as_basic_auth_and_refusals_are_clear(controller, password_file):
    env = {
        "SLUICE_PRAVEGA_USER": "admin",
        "SLUICE_PRAVEGA_PASSWORD_FILE": str(password_file),
        "SLUICE_PRAVEGA_ALLOW_PLAINTEXT_AUTH": "1",
    }
    channel = channel_for(controller.port, **env)
    channel.current_segments("sc", "st")
    expected = "Basic " + base64.b64encode(f"admin:{PASSWORD}".encode()).decode()
    assert controller.metadata[-1]["authorization"] == expected
    controller.refuse_auth = True
    with pytest.raises(StoreUnavailable, match="SLUICE_PRAVEGA_USER") as err:
        channel.current_segments("sc", "st")
    assert PASSWORD not in str(err.value)


def test_tls_channel_trusts_only_the_configured_ca(tls_controller, pki):
    trusted = channel_for(tls_controller.port, "pravegas", SLUICE_PRAVEGA_TRUSTSTORE=str(pki["ca"]))
    tls_controller.segments = [(0, 0.0, 1.0)]
    assert [r.segment for r in trusted.current_segments("sc", "st")] == [0]
    stranger = channel_for(
        tls_controller.port,
        "pravegas",
        SLUICE_PRAVEGA_TRUSTSTORE=str(pki["other-ca"]),
        SLUICE_PRAVEGA_RPC_TIMEOUT="5",
    )
    with pytest.raises(StoreUnavailable, match="got no answer"):
        stranger.current_segments("sc", "st")


@pytest.mark.timeout(30)
def test_controller_on_a_closed_port_is_unavailable():
    channel = channel_for(closed_port(), SLUICE_PRAVEGA_RPC_TIMEOUT="5")
    with pytest.raises(StoreUnavailable, match="checkTransactionState"):
        channel.txn_state("sc", "st", 1)


# --- transactions: state, idempotent commit, refusals ------------------------------------


def txn(controller, state: int | None, handle=None) -> PravegaTransaction:
    txn_id = uuid.uuid4().int
    if state is not None:
        controller.txns[txn_id_bits(txn_id)] = state
    return PravegaTransaction(
        "sc/st", txn_id, channel_for(controller.port), lambda op, call: call(), handle=handle
    )


def test_commit_of_a_committed_transaction_is_a_noop(controller):
    t = txn(controller, 3)
    t.commit()
    t.commit(time_bounds=(1, 2))
    assert t.state() == "committed"


def test_committing_an_aborted_transaction_fails(controller):
    t = txn(controller, 5)
    with pytest.raises(TxnFailed, match="aborted"):
        t.commit()
    t.abort()  # aborting twice is not an error
    assert t.state() == "aborted"


def test_unknown_transaction(controller):
    with pytest.raises(TxnNotFound):
        txn(controller, None).state()
    with pytest.raises(TxnNotFound):
        parse_txn_id("not-an-id")


def test_open_transaction_found_by_id_is_not_committed_blindly(controller):
    t = txn(controller, 1)
    assert t.state() == "open"
    with pytest.raises(Unsupported, match="abort"):
        t.commit()
    with pytest.raises(Unsupported, match="did not write it"):
        t.write(b"more")


def test_flush_is_unsupported_and_says_what_to_do(controller):
    with pytest.raises(Unsupported, match=re.escape("keep your input until commit() returns")):
        txn(controller, 1).flush()


def test_bad_time_bounds_and_large_events(controller):
    t = txn(controller, 1, handle=object())
    with pytest.raises(ValueError, match="time_bounds"):
        t.commit(time_bounds=(5, 1))
    with pytest.raises(EventTooLarge, match="over the limit"):
        t.write(b"x" * (MAX_EVENT_SIZE + 1))


def test_transaction_ids_round_trip():
    for value in (0, 1, (1 << 128) - 1, uuid.uuid4().int):
        assert parse_txn_id(format_txn_id(value)) == value
        high, low = txn_id_bits(value)
        assert ((high % (1 << 64)) << 64) | (low % (1 << 64)) == value
    assert parse_txn_id(uuid.UUID(int=7).hex) == 7


def test_controller_messages_match_the_proto_field_numbers():
    m = messages()
    request = m["TxnRequest"](
        streamInfo=m["StreamInfo"](scope="s", stream="t"), txnId=m["TxnId"](highBits=1, lowBits=2)
    )
    # field 1 StreamInfo{1: "s", 2: "t"}, field 2 TxnId{1: 1, 2: 2}
    assert request.SerializeToString().hex() == "0a060a0173120174120408011002"
    cut = m["StreamCut"](streamInfo=m["StreamInfo"](scope="s", stream="t"))
    cut.cut[3] = 100  # map<int64, int64> cut = 2
    assert cut.SerializeToString().hex() == "0a060a0173120174120408031064"


# --- retention as policy and tags --------------------------------------------------------


def test_retention_policy_and_tags_round_trip():
    for retention in (Retention(max_bytes=1 << 30), Retention(max_age_seconds=7 * 86400)):
        policy, tags = policy_for(pravega_client, retention)
        assert isinstance(policy, pravega_client.StreamRetentionPolicy)
        assert retention_from_tags(["team=edge", *tags]) == retention
    _, none_tags = policy_for(pravega_client, Retention())
    assert none_tags == []
    assert retention_from_tags(["other"]) == Retention()
    with pytest.raises(ValueError, match="positive"):
        policy_for(pravega_client, Retention(max_bytes=0))


# --- frames: exact reads of a segment's bytes --------------------------------------------


class SegmentImage:
    """Segment bytes in Pravega's event framing, seekable like `pravega_client.ByteStream`."""

    def __init__(self, payloads: list[bytes], head: int = 0) -> None:
        data = b"".join(struct.pack(">ii", 0, len(p)) + p for p in payloads)
        self._io = io.BytesIO(data)
        self._head = head
        self.offsets = []
        pos = 0
        for p in payloads:
            self.offsets.append(pos)
            pos += 8 + len(p)

    def current_head_offset(self) -> int:
        return self._head

    def current_tail_offset(self) -> int:
        return len(self._io.getbuffer())

    def seek(self, offset: int, whence: int) -> int:
        return self._io.seek(offset, whence)

    def readinto(self, buf) -> int:
        return self._io.readinto(buf)


def source(image: SegmentImage) -> frames.SegmentBytes:
    return frames.SegmentBytes(image, lambda op, call: call())


@pytest.mark.parametrize("chunk", [16, 1 << 20])
def test_frames_between_offsets_are_exact(monkeypatch, chunk):
    monkeypatch.setattr(frames, "READ_CHUNK", chunk)
    payloads = [f"event-{i}".encode() * (i % 4 + 1) for i in range(40)]
    image = SegmentImage(payloads)
    src = source(image)
    everything = list(frames.iter_frames(src, "sc/st", 7, 0, src.tail()))
    assert [e.payload for e in everything] == payloads
    assert [e.offset for e in everything] == image.offsets
    assert all(a.end_offset == b.offset for a, b in itertools.pairwise(everything))
    assert {e.segment for e in everything} == {7}
    middle = list(frames.iter_frames(src, "sc/st", 7, image.offsets[10], image.offsets[13]))
    assert [e.payload for e in middle] == payloads[10:13]
    assert frames.count_frames(src, image.offsets[5], src.tail()) == 35


def test_offsets_inside_an_event_are_refused():
    image = SegmentImage([b"0123456789" * 10, b"tail"])
    src = source(image)
    with pytest.raises(InvalidCut, match="not an event boundary"):
        list(frames.iter_frames(src, "sc/st", 0, 105, src.tail()))
    with pytest.raises(InvalidCut, match="not an event boundary"):
        list(frames.iter_frames(src, "sc/st", 0, 0, 50))
    with pytest.raises(InvalidCut, match="not an event boundary"):
        frames.check_boundary(src, 3, src.tail())
    frames.check_boundary(src, image.offsets[1], src.tail())


def test_a_large_event_is_read_whole(monkeypatch):
    monkeypatch.setattr(frames, "READ_CHUNK", 1024)
    big = os.urandom(3 << 20)
    src = source(SegmentImage([b"a", big, b"b"]))
    assert [e.payload for e in frames.iter_frames(src, "sc/st", 0, 0, src.tail())] == [
        b"a",
        big,
        b"b",
    ]


def test_stream_cut_text_of_pravega_segment_ids():
    # Pravega segment ids carry the epoch in their high 32 bits; the cut text keeps them whole.
    cut = StreamCut.of("sc", "st", {(3 << 32) | 1: 4096})
    assert StreamCut.parse(cut.text) == cut
    assert cut.text == "v1~sc~st~12884901889-4096"
