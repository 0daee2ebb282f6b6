"""`sluice store ...`: create, list, inspect, write, read, cut, truncate and retain streams."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import IO

from pipeline.cli.options import positive_number, whole_number
from pipeline.cli.process import Interruptible, lines_as_they_come, standard_input
from pipeline.cli.progress import Progress
from pipeline.config import default_store_uri
from pipeline.errors import SluiceError
from pipeline.streams import (
    EventTooLarge,
    EventWriter,
    InvalidCut,
    NoStore,
    StreamCut,
    StreamInfo,
    StreamNotFound,
    StreamSealed,
    StreamStore,
    open_store,
)
from pipeline.streams.names import check_routing_key
from pipeline.streams.values import MAX_SEGMENTS, Retention, ScalingPolicy
from pipeline.wording import agreeing, counted

FOLLOW_POLL_S = 0.2
#: `store write` flushes at least every this many lines,
WRITE_FLUSH_EVERY = 1000
#: and once the oldest line it has not flushed is this old (seconds),
WRITE_FLUSH_AFTER_S = 1.0
#: and whenever no line has come for this long: the producer is slow or idle.
INPUT_PAUSE_S = 0.1
#: A read between cuts this far apart shows its progress on standard error.
LARGE_READ_BYTES = 64 * 1024 * 1024
#: Store URIs whose controller applies retention by itself (`sluice store retain` has no work).
PRAVEGA_SCHEMES = ("pravega", "pravegas", "tcp", "tls")
#: `store scale --split`: segments a split makes unless --parts says;
SPLIT_PARTS = 2
#: `store scale --auto`: seconds of recent traffic it looks at unless --window says.
AUTO_WINDOW_S = 60.0


def register(subparsers: argparse._SubParsersAction) -> None:
    store = subparsers.add_parser("store", help="manage streams in the stream store")
    sub = store.add_subparsers(dest="store_command", required=True, metavar="ACTION")

    p = stream_action(sub, "create", "create SCOPE/STREAM", cmd_create)
    # no default: `create` of a stream that exists checks only the options given
    p.add_argument("--segments", type=segment_count, help=f"1 to {MAX_SEGMENTS} (default 1)")
    p.add_argument(
        "--retention-bytes",
        type=whole_number(1, "keep a positive whole number of bytes"),
        help="keep at most this many bytes",
    )
    p.add_argument(
        "--retention-seconds",
        type=positive_number("keep events for a positive number of seconds"),
        help="keep nothing older than this",
    )

    p = sub.add_parser("list", help="list streams (of one scope)")
    p.add_argument("scope", nargs="?", help="only this scope (default: every scope)")
    p.set_defaults(func=cmd_list)

    stream_action(sub, "info", "JSON: head and tail cuts, segments, bytes, events", cmd_info)

    p = stream_action(sub, "write", "append one event per line of standard input", cmd_write)
    p.add_argument("--routing-key", "-k", help="the routing key of every event (its segment)")

    p = stream_action(sub, "read", "print one event per line", cmd_read)
    p.add_argument(
        "--from", dest="start", default="head", metavar="head|tail|CUT", help="where to start"
    )
    until = p.add_mutually_exclusive_group()  # a read that follows has no end
    until.add_argument(
        "--to",
        dest="end",
        default=None,
        metavar="tail|CUT",
        help="where to stop (default: the tail)",
    )
    until.add_argument("--follow", "-f", action="store_true", help="keep printing new events")

    stream_action(sub, "cut", "print the tail cut", cmd_cut)

    p = stream_action(sub, "truncate", "drop everything before CUT", cmd_truncate)
    p.add_argument("cut", metavar="CUT", help="a cut's text form (`sluice store cut`)")

    p = sub.add_parser(
        "retain",
        help="apply the streams' retention policies now: drop what they no longer keep (safe "
        "beside running writers and readers; run it from a timer)",
    )
    p.add_argument(
        "streams", nargs="*", metavar="SCOPE/STREAM", help="default: every stream with a policy"
    )
    p.set_defaults(func=cmd_retain)

    p = stream_action(
        sub, "scale", "split a hot segment, merge cold ones, or apply a policy", cmd_scale
    )
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--split", type=int, metavar="SEGMENT", help="split this segment")
    how.add_argument(
        "--merge", type=segments_to_merge, metavar="A,B", help="neighbouring segments to merge"
    )
    how.add_argument(
        "--auto",
        type=auto_policy,
        metavar="KIND:TARGET",
        help="events_per_second:N or kbytes_per_second:N over the last --window seconds",
    )
    p.add_argument(
        "--parts",
        type=whole_number(2, "a split makes 2 or more segments"),
        help="segments a split makes (default 2; --split only)",
    )
    p.add_argument(
        "--window",
        type=positive_number("a number of seconds above 0"),
        help=f"seconds of recent traffic --auto looks at (default {AUTO_WINDOW_S:g})",
    )
    p.set_defaults(check_options=scale_options_refused)

    stream_action(sub, "seal", "refuse further writes to SCOPE/STREAM", cmd_seal)

    stream_action(sub, "delete", "delete a sealed stream", cmd_delete)

    scans = (
        (
            "verify",
            "check every block's checksum, the index, transactions and the catalog; exit 1 "
            "with one line per problem",
            cmd_verify,
        ),
        (
            "repair",
            "fix what needs no guess (index, catalog, torn tails) and list what it could not "
            "fix; run it while no other process uses the store",
            cmd_repair,
        ),
    )
    for name, help_text, func in scans:
        p = sub.add_parser(name, help=help_text)
        p.add_argument("stream", nargs="?", metavar="SCOPE/STREAM", help="default: every stream")
        p.set_defaults(func=func)


def stream_action(
    sub: argparse._SubParsersAction, name: str, help_text: str, func: Callable
) -> argparse.ArgumentParser:
    """An action on one stream: `sluice store NAME SCOPE/STREAM …`, run by `func`."""
    parser = sub.add_parser(name, help=help_text)
    parser.add_argument("stream", metavar="SCOPE/STREAM", help="the stream")
    parser.set_defaults(func=func)
    return parser


def segment_count(text: str) -> int:
    """`--segments`: a whole number from 1 to `MAX_SEGMENTS` (argparse prints the reason as
    one line, exit 2)."""
    rule = f"a stream has 1 to {MAX_SEGMENTS} segments"
    count = whole_number(1, rule)(text)
    if count > MAX_SEGMENTS:
        msg = f"{text}: {rule}"
        raise argparse.ArgumentTypeError(msg)
    return count


def scale_options_refused(args: argparse.Namespace) -> str | None:
    """Why `store scale`'s options do not go together, as argparse says it of a mutually
    exclusive group (`pipeline.cli.parse` refuses them, exit 2): --parts is for --split only,
    --window for --auto only. None when they do."""
    how = "--split" if args.split is not None else "--merge" if args.merge else "--auto"
    for option, value, only_with in (
        ("--parts", args.parts, "--split"),
        ("--window", args.window, "--auto"),
    ):
        if value is not None and how != only_with:
            return f"argument {option}: not allowed with argument {how}"
    return None


def segments_to_merge(text: str) -> list[int]:
    """`--merge A,B[,C…]`: two or more segment numbers."""
    try:
        segments = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        msg = f"{text!r} is not a list of segment numbers such as 1,2"
        raise argparse.ArgumentTypeError(msg) from None
    if len(set(segments)) < 2:
        msg = f"{text!r}: a merge takes 2 or more neighbouring segments, such as 1,2"
        raise argparse.ArgumentTypeError(msg)
    return segments


def auto_policy(text: str) -> ScalingPolicy:
    """`--auto KIND:TARGET`: the scaling policy it names, its target a rate above 0."""
    kind, _, target = text.partition(":")
    try:
        return ScalingPolicy(kind, float(target))  # type: ignore[arg-type]
    except ValueError:  # not a number, or not a policy (InvalidArgument)
        msg = (
            f"{text!r}: give events_per_second:N or kbytes_per_second:N, N a rate above 0"
            " per second"
        )
        raise argparse.ArgumentTypeError(msg) from None


def resolve_cut(store: StreamStore, stream: str, text: str) -> StreamCut:
    """`head`, `tail` or a cut's text form, checked against `stream`."""
    if text == "head":
        return store.head(stream)
    if text == "tail":
        return store.tail(stream)
    scope, name = stream.split("/", 1)
    return StreamCut.parse(text).check_stream(scope, name)


class StreamExistsOtherwise(SluiceError):
    """`store create` of a stream that exists, with options it was not created with: `exists`
    would take the options as applied. `have` and `asked` say what differs, `how` what changes
    it."""

    def __init__(self, stream: str, have: list[str], asked: list[str], how: list[str]) -> None:
        self.stream, self.have, self.asked, self.how = stream, have, asked, how
        msg = (
            f"{stream} exists, created with {' and '.join(have)}, not the {' and '.join(asked)}"
            f" asked for ({'; '.join(how)})"
        )
        super().__init__(msg)


def cmd_create(args: argparse.Namespace) -> int:
    """Create the stream, or say it `exists` (idempotent) when it exists as asked: with the
    segments and retention policy given, if any; else `StreamExistsOtherwise`."""
    retention = Retention(args.retention_bytes, args.retention_seconds)
    segments = 1 if args.segments is None else args.segments
    with open_store(args.store) as store:
        created = store.create_stream(args.stream, segments=segments, retention=retention)
        if not created:
            check_as_asked(store.info(args.stream), args)
    print(f"{'created' if created else 'exists'} {args.stream}")
    return 0


def check_as_asked(info: StreamInfo, args: argparse.Namespace) -> None:
    """Raise `StreamExistsOtherwise` if the stream that exists differs from what `create`'s
    options ask: the segments it was created with (a scale since changes nothing), or its
    retention policy (both limits, when either is given)."""
    stream = f"{info.scope}/{info.stream}"
    have, asked, how = [], [], []
    created_with = segments_at_creation(info)
    if args.segments is not None and args.segments != created_with:
        have.append(counted(created_with, "segment"))
        asked.append(counted(args.segments, "segment"))
        how.append(f"`sluice store scale {stream}` splits and merges its segments")
    retention = Retention(args.retention_bytes, args.retention_seconds)
    if retention != Retention() and retention != info.retention:
        policy = policy_text(info.retention)
        have.append(f"a retention policy ({policy})" if policy else "no retention policy")
        options = []
        if args.retention_bytes is not None:
            options.append(f"--retention-bytes {args.retention_bytes}")
        if args.retention_seconds is not None:
            options.append(f"--retention-seconds {args.retention_seconds:g}")  # as policy_text
        asked.append(" ".join(options))
        how.append(
            "no command changes a retention policy: create another stream, or seal, delete"
            f" and create {stream} again"
        )
    if have:
        raise StreamExistsOtherwise(stream, have, asked, how)


def segments_at_creation(info: StreamInfo) -> int:
    """How many segments the stream was created with: segments 0 to N-1 split the key space
    evenly, so the first segment (by number) that ends at the top of the key space is the
    last of them. A scale makes segments of higher numbers, and seals rather than drops."""
    last = min((s.segment for s in info.segments if s.key_range[1] == 1.0), default=None)
    if last is None:  # a backend that splits the key space otherwise
        return len(info.segments)
    return sum(1 for s in info.segments if s.segment <= last)


def cmd_list(args: argparse.Namespace) -> int:
    try:
        store = open_store(args.store, must_exist=True)
    except NoStore as exc:  # no stream to list (a new home, or a misspelt --store)
        print(f"sluice: {exc.reason}", file=sys.stderr)
        return 0
    with store:
        for name in store.list_streams(args.scope):
            print(name)
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    with open_store(args.store, must_exist=True) as store:
        print(json.dumps(store.info(args.stream).as_dict(), indent=2))
    return 0


class WriteStopped(SluiceError):
    """`store write` stopped on an error: it says what was written before it. A line the
    store refused (`line`: its number; an event too large) stops the command after the lines
    before it are flushed, `written` of them; a flush that failed (the stream sealed, the
    disk full) leaves `written` known durable of the `read` lines, the rest perhaps not."""

    def __init__(self, stream: str, reason: str, written: int, read: int, line: int | None) -> None:
        self.stream, self.reason, self.line = stream, reason, line
        self.written, self.read = written, read
        if line is not None:
            msg = (
                f"line {line}: {reason}; wrote {counted(written, 'event')} to {stream} before"
                " it (the lines after it were not read)"
            )
        else:
            unsure = read - written
            msg = (
                f"{reason}; of the {counted(read, 'line')} read, {written:,}"
                f" {agreeing(written, 'is', 'are')} known written to {stream} and {unsure:,}"
                " may not have been"
            )
        super().__init__(msg)


def cmd_write(args: argparse.Namespace) -> int:
    """Append each line of standard input. An event is durable (flushed) within about
    `WRITE_FLUSH_AFTER_S` of its line's arrival, however slow the producer (`tail -f log |
    sluice store write …`): the writer flushes every `WRITE_FLUSH_EVERY` lines, when the
    input pauses, and when the oldest line not flushed is that old. Ctrl-C or SIGTERM keeps
    (flushes) the lines read so far and says how many, then ends the command as interrupted
    (`Interruptible`); so does a line the store refuses (`WriteStopped`, exit 1)."""
    check_routing_key(args.routing_key)  # refused before a line is read, not at line 1
    with (
        Interruptible(lines_as_they_come(standard_input(), INPUT_PAUSE_S)) as lines,
        open_store(args.store, must_exist=True) as store,
        store.writer(args.stream) as writer,
    ):
        count = write_lines(writer, lines, args.stream, args.routing_key)
    print(f"wrote {counted(count, 'event')} to {args.stream}", file=sys.stderr)
    lines.raise_interrupt()
    return 0


def write_lines(
    writer: EventWriter, lines: Iterable[bytes | None], stream: str, routing_key: str | None
) -> int:
    """Write each line as an event, flushing as `cmd_write` says, and flush at the end;
    return how many were written. Nothing after a line that fails is read (`WriteStopped`)."""
    count = flushed = 0  # lines written; of them, flushed
    since = 0.0  # when the first line not flushed came

    def flush() -> int:
        try:
            writer.flush()
        except SluiceError as exc:
            raise WriteStopped(stream, str(exc), flushed, count, line=None) from exc
        return count

    for line in lines:
        if line is not None:
            try:
                writer.write(line.rstrip(b"\r"), routing_key=routing_key)
            except EventTooLarge as exc:  # refused before it was taken: keep those before it
                flushed = flush()
                raise WriteStopped(stream, str(exc), flushed, count, line=count + 1) from exc
            except SluiceError as exc:  # a flush the writer made by itself failed
                raise WriteStopped(stream, str(exc), flushed, count + 1, line=None) from exc
            count += 1
            if count - flushed == 1:
                since = time.monotonic()
        if count > flushed and (
            line is None
            or count - flushed >= WRITE_FLUSH_EVERY
            or time.monotonic() - since >= WRITE_FLUSH_AFTER_S
        ):
            flushed = flush()
    return flush()


def cmd_read(args: argparse.Namespace) -> int:
    out = sys.stdout.buffer
    with (
        open_store(args.store, must_exist=True) as store,
        quoting_whole_cuts([args.start, args.end]),
    ):
        start = resolve_cut(store, args.stream, args.start)
        while True:
            end = resolve_cut(store, args.stream, args.end or "tail")
            read_between(store, args, (start, end), out)
            if not args.follow or args.end:
                return 0
            start = end
            time.sleep(FOLLOW_POLL_S)


def read_between(
    store: StreamStore, args: argparse.Namespace, cuts: tuple[StreamCut, StreamCut], out: IO
) -> None:
    """Write the payloads between two cuts, one a line; a read of `LARGE_READ_BYTES` or more
    shows its progress in bytes on standard error."""
    start, end = cuts
    total = start.bytes_until(end)
    progress = Progress.of(args, data_on_stdout=True)
    if total < LARGE_READ_BYTES:
        progress = Progress("off")
    with progress.task(f"read {args.stream}") as task:
        done = 0
        for event in store.read(args.stream, start, end):
            out.write(event.payload + b"\n")
            done += event.end_offset - event.offset
            task.count(min(done, total), total)
        out.flush()
        task.count(total, total)


def cmd_cut(args: argparse.Namespace) -> int:
    with open_store(args.store, must_exist=True) as store:
        print(store.tail(args.stream).text)
    return 0


@contextmanager
def quoting_whole_cuts(given: Iterable[str | None]) -> Iterator[None]:
    """An `InvalidCut` the store raises of one position of a cut (quoting `0-49`, offset 49
    of segment 0 not an event boundary) is raised again quoting the whole cut given, the
    one that has that position."""
    texts = [text for text in given if text not in (None, "head", "tail")]
    try:
        yield
    except InvalidCut as exc:
        if type(exc) is not InvalidCut or exc.text in texts:
            raise
        whole = [text for text in texts if exc.text in text.strip().split("~")[3:]]
        if not whole:
            raise
        raise InvalidCut(whole[0], exc.reason) from exc


def cmd_truncate(args: argparse.Namespace) -> int:
    with open_store(args.store, must_exist=True) as store, quoting_whole_cuts([args.cut]):
        store.truncate(resolve_cut(store, args.stream, args.cut))
        print(f"truncated {args.stream}; head is now {store.head(args.stream).text}")
    return 0


def cmd_retain(args: argparse.Namespace) -> int:
    """Truncate each stream by its recorded policy; one line per stream that has one. Over
    every stream, a stream that fails is reported on standard error (exit 1) and the others
    are still retained, so a timer keeps freeing space."""
    uri = args.store or default_store_uri()
    if uri.partition(":")[0] in PRAVEGA_SCHEMES:  # nothing to ask: one timer fits both
        print(
            f"nothing to do: the Pravega controller of {uri} applies each stream's retention "
            "policy itself (every controller.retention.frequency.minutes)"
        )
        return 0
    with open_store(uri, must_exist=True) as store:
        if args.streams:
            for name in args.streams:
                print(retain(store, name, named=True))
            return 0
        said, failed = False, 0
        for name in store.list_streams():
            try:
                line = retain(store, name, named=False)
            except StreamNotFound:
                continue  # deleted since it was listed
            except SluiceError as exc:  # one damaged stream does not stop the others
                print(f"sluice: error: {name}: {exc}", file=sys.stderr)
                failed += 1
                continue
            if line is not None:
                print(line)
                said = True
    if not said and not failed:
        print("no stream has a retention policy (`sluice store create --retention-…`)")
    return 1 if failed else 0


def retain(store: StreamStore, stream: str, named: bool) -> str | None:
    """Apply `stream`'s policy and say what it dropped: the segments whose head moved and
    the bytes before the new heads; events as counted before and after. None for a stream
    without a policy, unless it was `named`."""
    before = store.info(stream)
    policy = policy_text(before.retention)
    if policy is None:
        return f"{stream}: no retention policy, kept everything" if named else None
    cut = store.apply_retention(stream)
    if cut is None:
        return f"{stream}: within its policy ({policy}), nothing dropped"
    after = store.info(stream)
    heads = before.head.segments
    moved = {seg: off - heads.get(seg, 0) for seg, off in cut.positions if off > heads.get(seg, 0)}
    numbers = ", ".join(map(str, sorted(moved)))
    return (
        f"{stream}: dropped {counted(sum(moved.values()), 'byte')} from "
        f"{'segments' if len(moved) > 1 else 'segment'} {numbers} ({policy}); "
        f"{counted(before.events, 'event')} before, {after.events:,} now; "
        f"head is now {after.head.text}"
    )


def policy_text(retention: Retention) -> str | None:
    """`at most 1,000 bytes, nothing older than 60 s`, or None for no policy."""
    parts = []
    if retention.max_bytes is not None:
        parts.append(f"at most {counted(retention.max_bytes, 'byte')}")
    if retention.max_age_seconds is not None:
        parts.append(f"nothing older than {retention.max_age_seconds:g} s")
    return ", ".join(parts) or None


class SealedNotScaled(SluiceError):
    """`store scale` of a sealed stream: its segments stay as they are."""

    def __init__(self, stream: str) -> None:
        self.stream = stream
        msg = f"stream {stream} is sealed, so it cannot be scaled: its segments stay as they are"
        super().__init__(msg)


def cmd_scale(args: argparse.Namespace) -> int:
    with open_store(args.store, must_exist=True) as store:
        try:
            created = scale(store, args)
        except StreamSealed:
            raise SealedNotScaled(args.stream) from None
        active = [s.segment for s in store.info(args.stream).segments if not s.sealed]
    print(f"created segments {created or 'none'}; active segments {active}")
    return 0


def scale(store: StreamStore, args: argparse.Namespace) -> list[int]:
    """Split, merge or auto-scale as `args` say; the segments made. `StreamSealed` for a
    sealed stream (an auto-scale would find nothing to do)."""
    if args.split is not None:
        parts = SPLIT_PARTS if args.parts is None else args.parts
        return store.split_segment(args.stream, args.split, parts)
    if args.merge:
        return [store.merge_segments(args.stream, args.merge)]
    if store.info(args.stream).sealed:
        scope, name = args.stream.split("/", 1)
        raise StreamSealed(scope, name)
    window = AUTO_WINDOW_S if args.window is None else args.window
    return store.auto_scale(args.stream, args.auto, window)


def cmd_seal(args: argparse.Namespace) -> int:
    with open_store(args.store, must_exist=True) as store:
        store.seal_stream(args.stream)
    print(f"sealed {args.stream}")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    with open_store(args.store, must_exist=True) as store:
        store.delete_stream(args.stream)
    print(f"deleted {args.stream}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    with open_store(args.store, must_exist=True) as store, Progress.of(args).task("verify") as task:
        report = store.verify(args.stream, task.count)
    for problem in report.problems:
        print(problem)
    checked = (
        f"{counted(report.streams, 'stream')}, {counted(report.segments, 'segment')}, "
        f"{counted(report.blocks, 'block')}, "
        f"{counted(report.bytes, 'byte')}"
    )
    if report.ok:
        print(f"intact: {checked}")
        return 0
    print(
        f"{counted(len(report.problems), 'problem')} in {checked}: `sluice store repair` "
        "fixes what can be fixed without guessing and lists the rest",
        file=sys.stderr,
    )
    return 1


def cmd_repair(args: argparse.Namespace) -> int:
    with open_store(args.store, must_exist=True) as store, Progress.of(args).task("repair") as task:
        report = store.repair(args.stream, task.count)
    for problem in report.fixed:
        print(f"fixed: {problem}")
    for problem in report.unfixed:
        print(f"not fixed: {problem}")
    if report.ok:
        print(f"repaired: {len(report.fixed)} fixed, nothing left")
        return 0
    print(f"{counted(len(report.unfixed), 'problem')} left for a person to fix", file=sys.stderr)
    return 1
