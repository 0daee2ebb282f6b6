"""A narrow gRPC line to the Pravega controller, for what the Python client does not expose.

Whether a closed transaction was committed or aborted, a stream's segments, and truncation at a
stream cut: plain RPCs of the controller's public gRPC service (same port, TLS and credentials
as the client), made with `grpcio` and declaring only the messages used, with field numbers
from Pravega's `Controller.proto` (`io.pravega.controller.stream.api.grpc.v1`). Every call has a
deadline (`SLUICE_PRAVEGA_RPC_TIMEOUT`): an unreachable controller is a `StoreUnavailable`
within it, never a hang. More: ADAPTER.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from pipeline.streams.errors import StoreUnavailable, StreamNotFound, StreamStoreError
from pipeline.streams.pravega.client import PravegaClientError
from pipeline.streams.pravega.settings import PravegaSettings

PACKAGE = "io.pravega.controller.stream.api.grpc.v1"
SERVICE = f"{PACKAGE}.ControllerService"

ControllerTxnState = Literal["unknown", "open", "committing", "committed", "aborting", "aborted"]
_TXN_STATES: tuple[ControllerTxnState, ...] = (
    "unknown",
    "open",
    "committing",
    "committed",
    "aborting",
    "aborted",
)
_UPDATE_STATUS = ("SUCCESS", "FAILURE", "STREAM_NOT_FOUND", "SCOPE_NOT_FOUND")

_F = descriptor_pb2.FieldDescriptorProto
# (name, number, type, label, message/enum type name or "")
_MESSAGES: dict[str, list[tuple[str, int, int, int, str]]] = {
    "StreamInfo": [
        ("scope", 1, _F.TYPE_STRING, _F.LABEL_OPTIONAL, ""),
        ("stream", 2, _F.TYPE_STRING, _F.LABEL_OPTIONAL, ""),
    ],
    "TxnId": [
        ("highBits", 1, _F.TYPE_INT64, _F.LABEL_OPTIONAL, ""),
        ("lowBits", 2, _F.TYPE_INT64, _F.LABEL_OPTIONAL, ""),
    ],
    "TxnRequest": [
        ("streamInfo", 1, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, "StreamInfo"),
        ("txnId", 2, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, "TxnId"),
        ("writerId", 3, _F.TYPE_STRING, _F.LABEL_OPTIONAL, ""),
        ("timestamp", 4, _F.TYPE_INT64, _F.LABEL_OPTIONAL, ""),
    ],
    "TxnState": [("state", 1, _F.TYPE_ENUM, _F.LABEL_OPTIONAL, "TxnState.State")],
    "SegmentId": [
        ("streamInfo", 1, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, "StreamInfo"),
        ("segmentId", 2, _F.TYPE_INT64, _F.LABEL_OPTIONAL, ""),
    ],
    "SegmentRange": [
        ("segmentId", 1, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, "SegmentId"),
        ("minKey", 2, _F.TYPE_DOUBLE, _F.LABEL_OPTIONAL, ""),
        ("maxKey", 3, _F.TYPE_DOUBLE, _F.LABEL_OPTIONAL, ""),
    ],
    "SegmentRanges": [
        ("segmentRanges", 1, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "SegmentRange"),
        ("delegationToken", 2, _F.TYPE_STRING, _F.LABEL_OPTIONAL, ""),
    ],
    "StreamCut": [
        ("streamInfo", 1, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, "StreamInfo"),
        ("cut", 2, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "StreamCut.CutEntry"),
    ],
    "UpdateStreamStatus": [
        ("status", 1, _F.TYPE_ENUM, _F.LABEL_OPTIONAL, "UpdateStreamStatus.Status"),
    ],
}
_ENUMS = {
    "TxnState": ("State", [s.upper() for s in _TXN_STATES]),
    "UpdateStreamStatus": ("Status", list(_UPDATE_STATUS)),
}


@cache
def messages() -> Mapping[str, Any]:
    """The message classes of the subset of Controller.proto used here, by name."""
    proto = descriptor_pb2.FileDescriptorProto(
        name="sluice/pravega_controller_subset.proto", package=PACKAGE, syntax="proto3"
    )
    for name, fields in _MESSAGES.items():
        message = proto.message_type.add(name=name)
        for fname, number, ftype, label, type_name in fields:
            field = message.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                field.type_name = f".{PACKAGE}.{type_name}"
        if name in _ENUMS:
            enum_name, values = _ENUMS[name]
            enum = message.enum_type.add(name=enum_name)
            for number, value in enumerate(values):
                enum.value.add(name=value, number=number)
        if name == "StreamCut":  # map<int64, int64> cut = 2;
            entry = message.nested_type.add(name="CutEntry")
            entry.options.map_entry = True
            entry.field.add(name="key", number=1, type=_F.TYPE_INT64, label=_F.LABEL_OPTIONAL)
            entry.field.add(name="value", number=2, type=_F.TYPE_INT64, label=_F.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{name}"))
        for name in _MESSAGES
    }


def txn_id_bits(txn_id: int) -> tuple[int, int]:
    """The (highBits, lowBits) signed 64-bit halves of a 128-bit Pravega transaction id."""
    if not 0 <= txn_id < 1 << 128:
        msg = f"a Pravega transaction id is a 128-bit number, not {txn_id}"
        raise ValueError(msg)
    return _signed(txn_id >> 64), _signed(txn_id & (1 << 64) - 1)


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


@dataclass(frozen=True, slots=True)
class SegmentRange:
    segment: int
    key_range: tuple[float, float]


class ControllerChannel:
    """Three controller RPCs with Sluice's TLS trust, credentials and deadline.

    The channel is opened on first use and closed by `close()`; one per store.
    """

    def __init__(self, settings: PravegaSettings) -> None:
        self._settings = settings
        self._channel: Any = None

    def __repr__(self) -> str:
        return f"ControllerChannel({self._settings.uri!r})"

    def txn_state(self, scope: str, stream: str, txn_id: int) -> ControllerTxnState:
        m = messages()
        high, low = txn_id_bits(txn_id)
        request = m["TxnRequest"](
            streamInfo=m["StreamInfo"](scope=scope, stream=stream),
            txnId=m["TxnId"](highBits=high, lowBits=low),
        )
        reply = self._call("checkTransactionState", request, "TxnState", (scope, stream))
        return _TXN_STATES[reply.state] if reply.state < len(_TXN_STATES) else "unknown"

    def current_segments(self, scope: str, stream: str) -> list[SegmentRange]:
        """The stream's open segments (none once it is sealed), by segment id."""
        m = messages()
        request = m["StreamInfo"](scope=scope, stream=stream)
        reply = self._call("getCurrentSegments", request, "SegmentRanges", (scope, stream))
        ranges = [
            SegmentRange(r.segmentId.segmentId, (r.minKey, r.maxKey)) for r in reply.segmentRanges
        ]
        return sorted(ranges, key=lambda r: r.segment)

    def truncate(self, scope: str, stream: str, positions: Mapping[int, int]) -> None:
        """Truncate the stream at the cut `positions` (segment id -> offset)."""
        m = messages()
        request = m["StreamCut"](streamInfo=m["StreamInfo"](scope=scope, stream=stream))
        for segment, offset in positions.items():
            request.cut[segment] = offset
        reply = self._call("truncateStream", request, "UpdateStreamStatus", (scope, stream))
        status = _UPDATE_STATUS[reply.status] if reply.status < len(_UPDATE_STATUS) else "?"
        if status in ("STREAM_NOT_FOUND", "SCOPE_NOT_FOUND"):
            raise StreamNotFound(scope, stream)
        if status != "SUCCESS":
            msg = f"the controller answered {status}"
            raise PravegaClientError(msg, operation="truncate")

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    # --- plumbing -------------------------------------------------------------------------
    def _call(self, method: str, request: Any, reply_type: str, stream: tuple[str, str]) -> Any:
        import grpc

        rpc = self._open().unary_unary(
            f"/{SERVICE}/{method}",
            request_serializer=lambda r: r.SerializeToString(),
            response_deserializer=messages()[reply_type].FromString,
        )
        try:
            return rpc(request, timeout=self._settings.rpc_timeout, metadata=self._metadata())
        except grpc.RpcError as exc:
            raise self._error(method, exc, stream) from None

    def _open(self) -> Any:
        if self._channel is None:
            import grpc

            target = self._settings.grpc_target
            if self._settings.tls:
                roots = b"\n".join(self._settings.trust_pems())
                credentials = grpc.ssl_channel_credentials(root_certificates=roots)
                self._channel = grpc.secure_channel(target, credentials)
            else:
                self._channel = grpc.insecure_channel(target)
        return self._channel

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        creds = self._settings.credentials
        return (("authorization", f"Basic {creds.basic_token()}"),) if creds else ()

    def _error(self, method: str, exc: Any, stream: tuple[str, str]) -> StreamStoreError:
        import grpc

        code = exc.code() if callable(getattr(exc, "code", None)) else None
        detail = self._settings.redact(str(exc.details() if hasattr(exc, "details") else exc))
        uri = self._settings.uri
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            reason = f"controller call {method} got no answer ({code.name}: {detail})"
            return StoreUnavailable(uri, reason)
        if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            reason = (
                f"the controller refused {method} ({code.name}): check SLUICE_PRAVEGA_USER, "
                "the password file and the user's ACL"
            )
            return StoreUnavailable(uri, reason)
        if code == grpc.StatusCode.NOT_FOUND:
            return StreamNotFound(*stream)
        name = code.name if code is not None else "error"
        return PravegaClientError(f"{name}: {detail}", operation=f"controller call {method}")
