"""A truncation that passed a job's checkpoint: found in a failure (the store's `Truncated`,
or Spark's report of it), and what to tell the user: what was dropped, and the cut a new
checkpoint goes on from without copying anything twice."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from pipeline.errors import SluiceError
from pipeline.jobs.checkpoint import committed_progress
from pipeline.streams import StreamCut, Truncated, open_store, parse_stream

if TYPE_CHECKING:
    from pipeline.jobs.checkpoint import Checkpoint


class JobSource(Protocol):
    """What is read of a job's source (`pipeline.jobs.runner.JobSource`)."""

    stream: str
    store: str


def truncation_of(exc: BaseException) -> Truncated | None:
    """The store's `Truncated` behind a failure: the error itself, or the last one that
    Spark's report of a failed query names."""
    return exc if isinstance(exc, Truncated) else Truncated.last_in(str(exc))


def truncated_reason(checkpoint: Checkpoint, sources: Sequence[JobSource], error: Truncated) -> str:
    """Why a job fails when a truncation passed its checkpoint: what was dropped, and how to
    go on with what remains (`--from` is read by a new checkpoint only)."""
    reason = (
        f"stream {error.stream} segment {error.segment} was truncated at offset "
        f"{error.truncated_at}, past where checkpoint {checkpoint.root} stands: the events it "
        "had yet to read before that offset were dropped, and it cannot go on without them "
        "(--from applies to a new checkpoint only). To go on with what remains, run again "
        f"with a new --checkpoint directory and --from {resume_from(checkpoint, sources, error)}"
    )
    return reason


def resume_from(checkpoint: Checkpoint, sources: Sequence[JobSource], error: Truncated) -> str:
    """Where a new checkpoint goes on from `checkpoint` without doing again what it did: the
    end of its last committed batch (else its start), each segment moved up to the head. `head`
    when there is more than one source (one cut cannot start them all), when the truncated
    stream is not the source, or when no position can be read."""
    if len(sources) != 1 or "/".join(parse_stream(sources[0].stream)) != error.stream:
        return "head"
    (source,) = sources
    try:
        progress = committed_progress(checkpoint.root)
        text = progress.end_cut.text if progress is not None else checkpoint.start_cut
        if text is None:
            return "head"
        with open_store(source.store) as opened:
            head = opened.head(source.stream)
        position = StreamCut.parse(text).check_same_stream(head).segments
    except (SluiceError, OSError):
        return "head"
    later = {seg: max(off, position.get(seg, 0)) for seg, off in head.segments.items()}
    return head.moved_to({**position, **later}).text
