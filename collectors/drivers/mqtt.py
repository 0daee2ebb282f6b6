"""MQTT driver: messages from subscribed topics, batched into events.

A persistent session keeps the broker queuing while the collector is away; messages are
acknowledged by hand, after the SQLite commit that buffers them (at QoS 1 even when 2 is
configured: paho acknowledges QoS 2 before the application sees it). Undecodable messages are
quarantined with their reason. A resumed session is not subscribed again (that would have the
broker send its retained messages again). Delivery guarantee: **at-least-once** into the buffer,
exactly-once from it on: a crash between the commit and the acknowledgement makes the broker
redeliver a batch, and MQTT has no stable message id to tell the copy apart.
A broker that cannot be reached is logged (at most once a minute), recorded for `sluice
collect status` (`connected`, `last_errors`), and tried again with backoff (1 s to 30 s);
stopping never waits for it. Details and settings: DRIVERS.md next to this file.
"""

from __future__ import annotations

import base64
import json
import math
import queue
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collectors.batch import columns_to_events, encode_json
from collectors.drivers.base import (
    Appended,
    CursorState,
    DriverContext,
    DriverSettings,
    OptionsReader,
    PendingEvent,
)
from collectors.errors import DriverError
from pipeline.streams import MAX_EVENT_SIZE

_LARGEST_PAYLOAD = MAX_EVENT_SIZE - 64 * 1024  # leave room for the event's other fields
#: A broker that stays unreachable is logged and recorded at most this often.
ERROR_EVERY_SECONDS = 60.0
#: Stopping waits at most this long for the network thread (it may be mid-connect).
STOP_WAIT_SECONDS = 2.0
#: The topic filters the broker's session for `client_id` holds, once it has confirmed them: a
#: resumed session is not subscribed again (the broker would send retained messages again).
CURSOR = "mqtt"
CURSOR_VERSION = 1


@dataclass(frozen=True, slots=True)
class Options:
    host: str
    port: int
    topics: tuple[str, ...]
    qos: int
    client_id: str | None
    username: str | None
    password: str | None = field(repr=False)
    tls: bool
    ca_file: Path | None
    keepalive: int
    payload_format: str
    max_inflight: int
    max_delay_ms: int


@dataclass(frozen=True, slots=True)
class Received:
    time_ns: int
    topic: str
    payload: bytes
    mid: int
    qos: int
    session: int  # which connection it came on: a PUBACK only means something on that one


def parse_options(r: OptionsReader) -> Options:
    topics = r.texts("topics")
    for topic in topics:
        if not _valid_filter(topic):
            r.fail("topics", f"has an invalid topic filter {topic!r}")
    qos = r.integer("qos", 1)
    if qos not in (1, 2):
        r.fail("qos", "must be 1 or 2 (QoS 0 cannot be acknowledged after buffering)")
    return Options(
        host=r.text("host", "localhost"),
        port=r.integer("port", 1883, minimum=1),
        topics=topics,
        qos=qos,
        client_id=r.text("client_id", None),
        username=r.text("username", None),
        password=r.secret("password", None),
        tls=r.flag("tls", False),
        ca_file=r.path("ca_file", None) if r.has("ca_file") else None,
        keepalive=r.integer("keepalive", 60, minimum=5),
        payload_format=r.choice("payload_format", ("text", "json", "base64"), "text"),
        max_inflight=r.integer("max_inflight", 20, minimum=1),
        max_delay_ms=r.integer("max_delay_ms", 200, minimum=1),
    )


def _valid_filter(topic: str) -> bool:
    """MQTT's rule: `+` and `#` only as a whole level, `#` only as the last one (paho
    refuses anything else on its network thread, where the driver would not hear of it)."""
    levels = topic.split("/")
    wildcards = all(level in ("+", "#") or not {"+", "#"} & set(level) for level in levels)
    return wildcards and "#" not in levels[:-1] and 0 < len(topic.encode()) <= 65535


def create(settings: DriverSettings) -> MqttDriver:
    options: Options = settings.options
    if options.ca_file is not None and not options.ca_file.is_file():
        raise DriverError(settings.name, "mqtt", f"ca_file {options.ca_file} does not exist")
    return MqttDriver(settings)


class MqttDriver:
    """A paho client on its own network thread; this thread batches, buffers and acks."""

    def __init__(self, settings: DriverSettings) -> None:
        self.settings = settings
        self.options: Options = settings.options
        self.client_id = self.options.client_id or f"sluice-{socket.gethostname()}-{settings.name}"
        self.constants = {"RemoteAddr": settings.routing_key or ""}
        self.inbox: queue.Queue[Received] = queue.Queue(maxsize=10_000)
        self.session = 0
        self.resumed = 0  # the last session the broker kept: it sends unacknowledged ones again
        self.broker = f"{self.options.host}:{self.options.port}"
        # Set by the network thread's callbacks, reported by the driver thread (which owns
        # the buffer connection): (connected, detail, failures so far).
        self._link: tuple[bool, str, int] | None = None
        self._failures = 0
        self._why = "no answer"  # why the last connect failed (paho's callback does not say)
        self.subscribed: tuple[str, ...] = ()  # as in the cursor
        self._asked: tuple[str, ...] = ()  # in the last SUBSCRIBE
        self._confirmed: tuple[str, ...] | None = None  # by a SUBACK, not yet in the cursor

    def run(self, ctx: DriverContext) -> None:
        if self.options.qos == 2:
            ctx.log.warning("subscribing at QoS 1, not 2: see collectors/drivers/mqtt.py")
        # Each run has its own client and `closing`: after a failure `run` is called again,
        # and the stopped client's callbacks must not silence the new one.
        closing = threading.Event()
        self._link = None
        state = ctx.cursor(CURSOR)
        if state is not None and state.value["client_id"] == self.client_id:
            self.subscribed = tuple(state.value["topics"])
        client = self._client(ctx, closing)
        client.connect_async(self.options.host, self.options.port, self.options.keepalive)
        client.loop_start()
        try:
            self._pump(ctx, client)
        finally:
            closing.set()
            _drain(self.inbox)  # unblock the network thread; these were not acknowledged
            _stop_client(client)

    def _client(self, ctx: DriverContext, closing: threading.Event) -> Any:
        import paho.mqtt.client as mqtt

        client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=self.client_id,
            clean_session=False,
            protocol=mqtt.MQTTv311,
            manual_ack=True,
        )
        if self.options.username:
            client.username_pw_set(self.options.username, self.options.password)
        if self.options.tls:
            client.tls_set(ca_certs=str(self.options.ca_file) if self.options.ca_file else None)
        client.reconnect_delay_set(1, 30)
        client.on_connect = lambda c, _u, f, code, _p: self._on_connect(c, f, code, closing)
        client.on_connect_fail = lambda _c, _u: self._down(f"cannot connect: {self._why}")
        client.on_disconnect = lambda _c, _u, _f, code, _p: self._on_disconnect(code, closing)
        client.on_message = lambda _c, _u, message: self._on_message(message, closing)
        client.on_subscribe = lambda _c, _u, _m, codes, _p: self._on_subscribe(codes)
        connect = client.reconnect

        def reconnect() -> Any:  # paho's loop reports a failed connect without its reason
            try:
                return connect()
            except OSError as exc:
                self._why = exc.strerror or str(exc) or type(exc).__name__
                raise

        client.reconnect = reconnect
        return client

    def _on_connect(self, client: Any, flags: Any, code: Any, closing: threading.Event) -> None:
        if closing.is_set():
            return
        if code.is_failure:
            self._down(f"the broker refused the connection: {code}")
            return
        self.session += 1
        topics = self.options.topics
        kept = self.subscribed if flags.session_present else ()
        if flags.session_present:
            self.resumed = self.session
        if gone := [topic for topic in kept if topic not in topics]:
            client.unsubscribe(gone)
        self._asked = tuple(topic for topic in topics if topic not in kept)
        if self._asked:
            client.subscribe([(topic, 1) for topic in self._asked])
        self._link = (True, f"broker {self.broker}", self._failures)

    def _on_subscribe(self, codes: list) -> None:
        refused = [t for t, code in zip(self._asked, codes, strict=False) if code.is_failure]
        if refused:
            self._down(f"the broker refused the subscription to {', '.join(refused)}")
        else:
            self._confirmed = self.options.topics

    def _on_disconnect(self, code: Any, closing: threading.Event) -> None:
        if not closing.is_set():
            self._down(f"connection lost ({code}): reconnecting")

    def _down(self, detail: str) -> None:
        self._failures += 1
        self._link = (False, f"broker {self.broker}: {detail}", self._failures)

    def _report(self, ctx: DriverContext, reported: int) -> int:
        """Hand the network thread's news to the buffer (from this thread); returns the
        number of failures reported so far."""
        link = self._link
        if link is None:
            return reported
        connected, detail, failures = link
        ctx.set_connected(connected, detail)
        if (confirmed := self._confirmed) is not None:
            value = {"client_id": self.client_id, "topics": list(confirmed)}
            ctx.append([], CursorState(CURSOR, CURSOR_VERSION, value))
            self.subscribed, self._confirmed = confirmed, None
        if failures > reported and not connected:
            ctx.error("connect", f"{detail} (retrying with backoff)", every=ERROR_EVERY_SECONDS)
        return failures

    def _on_message(self, message: Any, closing: threading.Event) -> None:
        if closing.is_set():
            return  # not acknowledged: the broker sends it again next session
        received = Received(
            time.time_ns(),
            message.topic,
            message.payload,
            message.mid,
            message.qos,
            self.session,
        )
        self.inbox.put(received)

    def _pump(self, ctx: DriverContext, client: Any) -> None:
        pending: list[Received] = []
        first_at = 0.0
        max_delay = self.options.max_delay_ms / 1000.0
        limit = min(self.settings.samples_per_event, self.options.max_inflight)
        reported = 0
        while ctx.running:
            reported = self._report(ctx, reported)
            wait = 0.25 if not pending else max(0.0, first_at + max_delay - time.monotonic())
            try:
                pending.append(self.inbox.get(timeout=wait))
                first_at = first_at if len(pending) > 1 else time.monotonic()
            except queue.Empty:
                pass
            if pending and (len(pending) >= limit or time.monotonic() - first_at >= max_delay):
                self._flush(ctx, client, pending)
                pending = []
        if pending:
            self._flush(ctx, client, pending)

    def _flush(self, ctx: DriverContext, client: Any, batch: list[Received]) -> None:
        """Buffer the batch (bad messages quarantined) in one commit, then acknowledge it."""
        session = self.session
        if self.resumed == session:  # the broker sends unacknowledged messages again
            batch = [m for m in batch if m.session == session]
        good, bad = self._decode(batch)
        events: list[PendingEvent] = []
        if good:
            columns = {
                "TimestampNanos": [m.time_ns for m, _ in good],
                "Topic": [m.topic for m, _ in good],
                "Payload": [value for _, value in good],
            }
            events = columns_to_events(columns, self.constants, self.settings.routing_key)

        def quarantine(c: Any) -> None:
            for message, reason in bad:
                ctx.buffer.quarantine(c, f"mqtt {message.topic}", reason, message.payload)

        if ctx.append(events, hook=quarantine if bad else None) is Appended.STOPPED:
            return
        for message, reason in bad:
            ctx.log.warning("quarantined a message from %s: %s", message.topic, reason)
        for message in batch:
            if message.qos > 0 and message.session == self.session:  # now, not `session`
                client.ack(message.mid, message.qos)

    def _decode(self, batch: list[Received]) -> tuple[list, list]:
        good: list[tuple[Received, Any]] = []
        bad: list[tuple[Received, str]] = []
        for message in batch:
            if len(message.payload) > _LARGEST_PAYLOAD:
                bad.append((message, f"payload of {len(message.payload)} bytes is too large"))
                continue
            try:
                value = self._payload(message.payload)
            except (ValueError, RecursionError) as exc:  # RecursionError: nested too deeply
                bad.append((message, f"payload is not {self.options.payload_format}: {exc}"))
                continue
            # Escapes (text, JSON) and base64 make the value up to 6 times the payload's size.
            if len(message.payload) * 6 > _LARGEST_PAYLOAD:
                size = len(encode_json(value))
                if size > _LARGEST_PAYLOAD:
                    reason = f"payload of {len(message.payload)} bytes is too large as JSON"
                    bad.append((message, f"{reason} ({size} bytes)"))
                    continue
            good.append((message, value))
        return good, bad

    def _payload(self, payload: bytes) -> Any:
        if self.options.payload_format == "base64":
            return base64.b64encode(payload).decode()
        text = payload.decode("utf-8")  # UnicodeDecodeError is a ValueError
        if self.options.payload_format == "json":
            return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite)
        return text


def _refuse_constant(name: str) -> Any:
    msg = f"{name} is not valid JSON"
    raise ValueError(msg)


def _finite(text: str) -> float:
    """A JSON number as a float; one beyond a double's range (`1e400`) is refused rather than
    kept as infinity (which JSON cannot hold: it was written as null)."""
    number = float(text)
    if not math.isfinite(number):
        msg = f"the number {text} is beyond the range of a double"
        raise ValueError(msg)
    return number


def _stop_client(client: Any) -> None:
    """Disconnect and stop the network thread, waiting for it at most STOP_WAIT_SECONDS (a
    connect in progress to an unreachable host may hold it longer; it is a daemon thread)."""
    client.disconnect()
    stopper = threading.Thread(target=client.loop_stop, name="mqtt-stop", daemon=True)
    stopper.start()
    stopper.join(STOP_WAIT_SECONDS)


def _drain(inbox: queue.Queue) -> None:
    while True:
        try:
            inbox.get_nowait()
        except queue.Empty:
            return
