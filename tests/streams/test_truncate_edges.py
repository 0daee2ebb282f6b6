"""`truncate` at cuts the head has passed already: nothing to do, and no error."""

from __future__ import annotations

from pipeline.streams import StreamCut


def test_a_truncate_at_a_cut_the_head_passed_inside_a_dropped_block_does_nothing(store):
    store.create_stream("tr/old")
    for _ in range(3):  # three blocks of ten 3 kB events: the first is dropped whole below
        with store.writer("tr/old") as w:
            for i in range(10):
                w.write(bytes([65 + i]) * 3000)
    events = list(store.read("tr/old"))
    older = StreamCut.of("tr", "old", {0: events[5].offset})  # inside the first block
    store.truncate(StreamCut.of("tr", "old", {0: events[25].offset}))
    head = store.head("tr/old")
    store.truncate(older)
    assert store.head("tr/old") == head
    assert [e.offset for e in store.read("tr/old")] == [e.offset for e in events[25:]]
    assert store.verify("tr/old").ok
