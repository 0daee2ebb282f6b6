"""Prometheus metrics of a running collector, served when `[collector] metrics_port` is set.

A scrape reads every instance's buffer through `status.collect_status`, the function behind
`sluice collect status`, so the endpoint and the command cannot disagree: nothing is counted
in memory. The counters are the buffer's own (written in the SQLite transaction that does
what they count): they survive restarts, and start again at 0 only with a new buffer file,
which Prometheus reads as a counter reset. Every series has the labels `instance` and
`driver`; the metrics are listed in docker/README.md ("Collector metrics").

The endpoint is prometheus_client's HTTP server on a daemon thread, with a registry of its
own: these metrics only, no process or Python ones. It listens on 127.0.0.1 unless
`metrics_address` names another address, serves until the service has drained and
stopped, and a port it cannot listen on is a `MetricsUnavailable` at start-up, before
anything is sampled.
"""

from __future__ import annotations

import errno
import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)

from collectors.errors import MetricsUnavailable
from collectors.settings import CollectorSettings
from collectors.status import InstanceStatus, collect_status

log = logging.getLogger(__name__)

PREFIX = "sluice_collector_"
LABELS = ("instance", "driver")
#: A last error's message is a label: long ones are cut to this many characters.
MESSAGE_LABEL_MAX = 300

#: Every counter of the buffer (`buffer/schema.py: COUNTERS`) -> metric (before `_total`), help.
#: `blocked_ms` is served in seconds; a driver's own counters (the files driver's
#: `files_done`, ...) are `driver_counter_total{counter=...}`.
COUNTER_METRICS: dict[str, tuple[str, str]] = {
    "samples_buffered": ("samples_buffered", "Samples the driver put in the buffer."),
    "events_buffered": ("events_buffered", "Events the driver put in the buffer."),
    "samples_committed": ("samples_committed", "Samples sent: committed to the stream."),
    "events_committed": ("events_committed", "Events sent: committed to the stream."),
    "txns_committed": ("txns_committed", "Stream transactions committed."),
    "txns_recommitted": (
        "txns_recommitted",
        "Recorded transactions committed again after a restart or a failure.",
    ),
    "txns_aborted": ("txns_aborted", "Open stream transactions aborted (their batch is resent)."),
    "txns_requeued": (
        "txns_requeued",
        "Ready transactions the store had aborted: their batch went back to the queue.",
    ),
    "txns_doubtful": (
        "txns_doubtful",
        "Transactions the store no longer knew: their events are kept, not re-sent.",
    ),
    "doubtful_dropped": (
        "doubtful_dropped",
        "Doubtful events the operator dropped (sluice collect resolve --drop).",
    ),
    "doubtful_resent": (
        "doubtful_resent",
        "Doubtful events the operator put back in the send queue (--resend).",
    ),
    "events_shed": ("events_shed", "Events dropped on a full buffer (when_full = shed)."),
    "samples_shed": ("samples_shed", "Samples dropped on a full buffer (when_full = shed)."),
    "blocked_ms": ("blocked_seconds", "Time the driver waited for room in a full buffer."),
    "errors": ("errors", "Errors recorded (driver, sender), as listed by collect status."),
    "quarantined": ("quarantined", "Bad inputs kept aside with the reason they were refused."),
}


class StatusCollector:
    """A prometheus_client collector that reads every instance's status at scrape time."""

    def __init__(self, settings: CollectorSettings) -> None:
        self.settings = settings

    def describe(self) -> list[Metric]:
        """The metric families, without samples (the registry checks their names)."""
        return _Families().all()

    def collect(self) -> list[Metric]:
        families = _Families()
        for status in collect_status(self.settings):
            families.add(status)
        return families.all()


class _Families:
    """One scrape's metric families, filled one instance status at a time."""

    def __init__(self) -> None:
        self.read = _counter("samples_read", "Samples the driver read: buffered, or shed.")
        self.counters = {key: _counter(name, text) for key, (name, text) in COUNTER_METRICS.items()}
        self.driver_counters = _counter(
            "driver_counter", "A driver's own counters (the files driver's files_done, ...).", 1
        )
        self.running = _gauge("running", "1 while the instance's process holds its buffer.")
        self.healthy = _gauge(
            "healthy", "1 when collect status --check passes for the instance, else 0."
        )
        self.connected = _gauge(
            "driver_connected",
            "1 while the driver reaches its source (drivers with a connection: MQTT).",
        )
        self.depth = _gauge("buffer_depth_events", "Events in the buffer (queued or in flight).")
        self.capacity = _gauge("buffer_capacity_events", "The buffer's capacity_events.")
        self.queued = _gauge("buffer_queued_samples", "Samples in events not yet sent.")
        self.pending = _gauge("pending_txns", "Stream transactions awaiting commit.")
        self.doubtful = _gauge("doubtful_txns", "Doubtful transactions kept in the buffer.")
        self.lag = _gauge(
            "lag_seconds", "Now minus the newest sample time committed to the stream."
        )
        self.last_committed = _gauge(
            "last_committed_timestamp_seconds", "The newest sample time committed to the stream."
        )
        self.oldest = _gauge(
            "oldest_buffered_timestamp_seconds", "The oldest sample time still in the buffer."
        )
        self.last_error = GaugeMetricFamily(
            PREFIX + "last_error_timestamp_seconds",
            "When each source (the driver, the sender) last recorded an error, and its message,"
            " among the five newest errors that collect status lists.",
            labels=(*LABELS, "source", "message"),
        )
        self.info = InfoMetricFamily(
            PREFIX + "instance",
            "The instance's stream and transaction protocol (as set, and as used).",
            labels=LABELS,
        )

    def all(self) -> list[Metric]:
        return [
            self.info,
            self.running,
            self.healthy,
            self.connected,
            self.read,
            *self.counters.values(),
            self.driver_counters,
            self.depth,
            self.capacity,
            self.queued,
            self.pending,
            self.doubtful,
            self.lag,
            self.last_committed,
            self.oldest,
            self.last_error,
        ]

    def add(self, s: InstanceStatus) -> None:
        labels = [s.name, s.driver]
        self.info.add_metric(
            labels,
            {
                "stream": s.stream,
                "txn_protocol": s.txn_protocol,
                "txn_protocol_used": s.txn_protocol_used or "",
            },
        )
        self.running.add_metric(labels, float(s.running))
        self.healthy.add_metric(labels, float(s.healthy))
        if s.connected is not None:
            self.connected.add_metric(labels, float(s.connected))
        self.read.add_metric(labels, s.samples_read)
        for key, value in s.counters.items():
            if key in self.counters:
                scale = 1000.0 if key == "blocked_ms" else 1.0
                self.counters[key].add_metric(labels, value / scale)
            else:
                self.driver_counters.add_metric([*labels, key], value)
        for key in self.counters.keys() - s.counters.keys():
            self.counters[key].add_metric(labels, 0.0)  # not counted yet: 0, not absent
        self.depth.add_metric(labels, s.depth_events)
        self.capacity.add_metric(labels, s.capacity_events)
        self.queued.add_metric(labels, s.queued_samples)
        self.pending.add_metric(labels, s.pending_txns)
        self.doubtful.add_metric(labels, s.doubtful_txns)
        if s.lag_seconds is not None:
            self.lag.add_metric(labels, s.lag_seconds)
        if s.last_committed_ns is not None:
            self.last_committed.add_metric(labels, s.last_committed_ns / 1e9)
        if s.oldest_buffered_ns is not None:
            self.oldest.add_metric(labels, s.oldest_buffered_ns / 1e9)
        for error in last_error_per_source(s.last_errors):
            message = error["message"][:MESSAGE_LABEL_MAX]
            self.last_error.add_metric([*labels, error["source"], message], error["time_ns"] / 1e9)


def last_error_per_source(errors: Iterable[dict]) -> list[dict]:
    """The newest error of each source, from `InstanceStatus.last_errors` (newest first)."""
    newest: dict[str, dict] = {}
    for error in errors:
        newest.setdefault(error["source"], error)
    return list(newest.values())


def _counter(name: str, text: str, extra_labels: int = 0) -> CounterMetricFamily:
    labels = (*LABELS, "counter")[: len(LABELS) + extra_labels]
    return CounterMetricFamily(PREFIX + name, text, labels=labels)


def _gauge(name: str, text: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, text, labels=LABELS)


@dataclass(frozen=True, slots=True)
class MetricsEndpoint:
    """The running HTTP server; `close()` stops it and frees the port."""

    address: str
    port: int
    server: WSGIServer
    thread: threading.Thread

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5.0)


def serve_metrics(settings: CollectorSettings) -> MetricsEndpoint | None:
    """Start the endpoint if `metrics_port` is set (None if it is not)."""
    port, address = settings.metrics_port, settings.metrics_address
    if port is None:
        return None
    registry = CollectorRegistry()
    registry.register(StatusCollector(settings))
    try:
        server, thread = start_http_server(port, addr=address, registry=registry)
    except OSError as exc:
        raise MetricsUnavailable(address, port, _why(exc)) from None
    endpoint = MetricsEndpoint(address, port, server, thread)
    log.info("metrics: %s (Prometheus text format)", endpoint.url)
    return endpoint


def _why(exc: OSError) -> str:
    reasons = {
        errno.EADDRINUSE: "the port is in use (another collector, or another program)",
        errno.EACCES: "permission denied (a port below 1024 needs privileges)",
        errno.EADDRNOTAVAIL: "the address is not one of this box's",
    }
    return reasons.get(exc.errno or 0) or exc.strerror or str(exc)
