"""The sender's loop: a drain ends only on a queue seen empty after the drivers stopped."""

from __future__ import annotations

import threading

from collectors.buffer import Buffer
from collectors.buffer.schema import PendingEvent
from collectors.sender import Sender
from pipeline.failpoints import Failpoints
from pipeline.streams import open_store

STREAM = "site/samples"


def event(i: int) -> PendingEvent:
    return PendingEvent(f"e{i}".encode(), "k", 100 + i, 200 + i, 1)


class LastAppendDuringAnEmptyStep(Sender):
    """The race of a shutdown: while a step finds the queue empty, the driver makes its last
    append and stops, and the service sets `drain`, all before the step returns."""

    def __init__(self, *args, drain: threading.Event, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.drain, self.raced = drain, False

    def _step(self, drain: threading.Event) -> int:
        sent = super()._step(drain)
        if not sent and not self.raced:
            self.raced = True
            self.buffer.append([event(99)])  # the driver's final partial batch
            self.drain.set()  # the service: drivers joined, now drain
        return sent


def test_an_append_racing_the_drain_is_still_sent(make_config):
    config = make_config({"c": {"driver": "generator", "stream": STREAM}}).instances[0]
    buffer = Buffer(config.buffer_file, config.capacity_events)
    buffer.append([event(0), event(1)])
    drain, halt = threading.Event(), threading.Event()
    sender = LastAppendDuringAnEmptyStep(config, buffer, Failpoints(), drain=drain)
    runner = threading.Thread(target=sender.run, args=(drain, halt))
    runner.start()
    runner.join(30)
    halt.set()
    assert not runner.is_alive()
    assert sender.raced
    with open_store(config.store) as store:
        assert [e.payload for e in store.read(STREAM)] == [b"e0", b"e1", b"e99"]
    assert buffer.depth() == 0
