"""`sluice collect status` measures how long a running collector has been disconnected,
failing or silent by the monotonic clock: a step of the wall clock (an NTP correction, a
clock set by hand) neither hides an outage nor invents one."""

from __future__ import annotations

from collectors.status import _Ages, _health

S = 10**9
NOW_NS, NOW_MONO_NS = 1_800_000_000 * S, 5_000 * S


def health(meta: dict[str, str]) -> list[str]:
    return _health(True, meta, _Ages(meta, NOW_NS, NOW_MONO_NS), limit=60.0)["problems"]


def disconnected(wall_ago: int, mono_ago: int | None) -> dict[str, str]:
    meta = {
        "driver_connected": "0",
        "driver_detail": "broker gone",
        "driver_since_ns": str(NOW_NS - wall_ago * S),
        "heartbeat_ns": str(NOW_NS),
        "heartbeat_mono_ns": str(NOW_MONO_NS),
    }
    if mono_ago is not None:
        meta["driver_since_mono_ns"] = str(NOW_MONO_NS - mono_ago * S)
    return meta


def test_a_clock_stepped_back_during_an_outage_does_not_hide_it():
    assert health(disconnected(wall_ago=0, mono_ago=120)) == [
        "driver disconnected for 120s: broker gone"
    ]


def test_a_clock_stepped_forward_does_not_invent_an_outage():
    assert health(disconnected(wall_ago=3600, mono_ago=1)) == []


def test_a_sender_failing_and_silent_are_measured_the_same_way():
    meta = {
        "sender_state": "retrying: StoreUnavailable",
        "sender_failing_since_ns": str(NOW_NS + 3600 * S),  # the clock went back an hour
        "sender_failing_since_mono_ns": str(NOW_MONO_NS - 90 * S),
        "heartbeat_ns": str(NOW_NS - 7200 * S),  # and forward
        "heartbeat_mono_ns": str(NOW_MONO_NS - 5 * S),
    }
    assert health(meta) == ["sender failing for 90s: retrying: StoreUnavailable"]


def test_stamps_of_an_older_collector_are_measured_by_the_wall_clock():
    assert health(disconnected(wall_ago=120, mono_ago=None)) == [
        "driver disconnected for 120s: broker gone"
    ]
