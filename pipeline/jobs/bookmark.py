"""The bookmark job: watch a stream and record a slice wherever a sensor's condition holds.

    sluice run bookmark --stream examples/network --schema NetworkSamples \\
        --sensor-by RemoteAddr,Interface --burst-mbps 50 --available-now

Bookmarking and slicing as in Pravega's StreamCuts sample: per sensor, a run of consecutive
events meeting a condition (`--below`, `--above`, `--burst-mbps`, `--predicate`) becomes one
slice with cuts as tight as event boundaries allow, if at least `--min-samples` of its samples
meet it (shorter runs, a lone spike, are not slices). Delivery: **exactly-once slices** (state
saved per batch, deterministic slice ids). A checkpoint keeps the conditions, sensors and
minimum its state was made with: a run with others is refused (`ParametersChanged`), never
mixed. Conditions, cuts, state: `DESIGN.md`, "bookmark"."""

from __future__ import annotations

import importlib
import json
import logging
import operator
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pyarrow as pa

from pipeline.errors import SluiceError
from pipeline.jobs.checkpoint import Checkpoint, JobIdentity, JobParameters, default_checkpoint
from pipeline.jobs.in_process import events_batch
from pipeline.jobs.runner import (
    SERVICE,
    BatchReport,
    BatchStates,
    JobFailed,
    JobSource,
    JobSummary,
    RunOptions,
    flag_number,
    run_query,
    sluice_run,
)
from pipeline.jobs.slices import DEFAULT_SLICES_STREAM, SliceRecord, record_slices
from pipeline.streams import InvalidName, StreamCut, open_store, parse_stream

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamWriter

    from pipeline.schemas import FlattenPlan
    from pipeline.streams import StreamStore

log = logging.getLogger(__name__)

STATE_VERSION = 1
DEFAULT_NAME = "bookmark"
Kind = Literal["below", "above", "burst", "predicate"]
#: the order conditions take in a spec (and on the command line)
KINDS: tuple[Kind, ...] = ("below", "above", "burst", "predicate")


class BookmarkError(SluiceError, ValueError):
    def __init__(self, what: str, reason: str) -> None:
        self.what, self.reason = what, reason
        msg = f"bookmark {what}: {reason}"
        super().__init__(msg)


# --- conditions -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Condition:
    kind: Kind
    field: str = ""
    value: float = 0.0
    predicate: str = ""

    def describe(self) -> str:
        if self.kind == "below":
            return f"{self.field} < {self.value:g}"
        if self.kind == "above":
            return f"{self.field} > {self.value:g}"
        if self.kind == "burst":
            return f"NIC rate above {self.value:g} Mbit/s"
        return f"predicate {self.predicate}"

    def flags(self) -> list[str]:
        """The `sluice run bookmark` flag that gives this condition."""
        if self.kind in ("below", "above"):
            return [f"--{self.kind}", f"{self.field}={flag_number(self.value)}"]
        if self.kind == "burst":
            return ["--burst-mbps", flag_number(self.value)]
        return ["--predicate", self.predicate]


def threshold(kind: Literal["below", "above"], text: str) -> Condition:
    """`FIELD=VALUE` of `--below` / `--above`."""
    name, eq, value = text.partition("=")
    try:
        number = float(value)
    except ValueError:
        number = None
    if not eq or not name or number is None:
        msg = f"--{kind} {text!r}"
        raise BookmarkError(msg, "expected FIELD=NUMBER, e.g. value=0")
    return Condition(kind, field=name.strip(), value=number)


def conditions_of(
    below: Iterable[str] = (),
    above: Iterable[str] = (),
    burst_mbps: float | None = None,
    predicates: Iterable[str] = (),
) -> tuple[Condition, ...]:
    """Conditions from their text forms: `FIELD=VALUE` thresholds, a NIC rate, predicates."""
    found = [threshold("below", text) for text in below]
    found += [threshold("above", text) for text in above]
    if burst_mbps is not None:
        found.append(Condition("burst", value=burst_mbps))
    found += [Condition("predicate", predicate=name) for name in predicates]
    return tuple(found)


def _predicate(spec: str) -> Callable[[pd.DataFrame], Any]:
    module, colon, name = spec.partition(":")
    function = getattr(importlib.import_module(module), name, None) if colon else None
    if not callable(function):
        msg = f"--predicate {spec!r}"
        raise BookmarkError(msg, "name a function as module:function")
    return function


# --- state ----------------------------------------------------------------------------------


@dataclass(slots=True)
class OpenRun:
    """A sensor's run in progress: per segment [first offset, last end offset], times, and
    how many samples met the condition (None: a run from a state saved before they were
    counted, which passes any `min_samples`)."""

    ranges: dict[int, list[int]]
    t_min: int
    t_max: int
    samples: int | None = 0


@dataclass(slots=True)
class BookmarkState:
    """What the job carries from batch to batch (saved as JSON after each batch)."""

    runs: dict[str, OpenRun] = field(default_factory=dict)
    #: per sensor: [time_ns, rx, tx] of its latest sample (for rates across events)
    last: dict[str, list[int]] = field(default_factory=dict)
    version: int = STATE_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> BookmarkState:
        data = json.loads(text)
        if data.get("version") != STATE_VERSION:
            msg = "state"
            raise BookmarkError(msg, f"version {data.get('version')!r} is not {STATE_VERSION}")
        runs = {
            k: OpenRun(
                {int(s): r for s, r in v["ranges"].items()},
                v["t_min"],
                v["t_max"],
                v.get("samples"),
            )
            for k, v in data["runs"].items()
        }
        return cls(runs=runs, last={k: list(v) for k, v in data["last"].items()})


@dataclass(frozen=True, slots=True)
class BookmarkSpec:
    """What to watch, for which conditions, per what sensor; `name` goes into each slice's
    `created_by`; a run becomes a slice when at least `min_samples` of its samples meet a
    condition. Conditions are kept in `KINDS` order, so a spec and its command line give the
    same `reason` and so the same slice ids."""

    stream: str
    schema: str
    store: str
    conditions: tuple[Condition, ...]
    sensor_by: str = "routing_key"
    slices_stream: str = DEFAULT_SLICES_STREAM
    name: str = DEFAULT_NAME
    min_samples: int = 1

    def __post_init__(self) -> None:
        ordered = sorted(self.conditions, key=lambda c: KINDS.index(c.kind))
        object.__setattr__(self, "conditions", tuple(ordered))

    @property
    def reason(self) -> str:
        said = " or ".join(c.describe() for c in self.conditions)
        return said if self.min_samples == 1 else f"{said}, at least {self.min_samples} samples"

    def command_line(self, run: RunOptions = SERVICE) -> list[str]:
        """The `sluice run bookmark …` argv that runs exactly this spec."""
        if sum(c.kind == "burst" for c in self.conditions) > 1:
            msg = "--burst-mbps"
            raise BookmarkError(msg, "the command line takes one burst condition")
        flags = ["--stream", self.stream, "--schema", self.schema, "--sensor-by", self.sensor_by]
        flags += [flag for c in self.conditions for flag in c.flags()]
        flags += ["--slices-stream", self.slices_stream]
        if self.min_samples != 1:
            flags += ["--min-samples", str(self.min_samples)]
        if self.name != DEFAULT_NAME:
            flags += ["--name", self.name]
        return sluice_run(self.store, "bookmark", flags, run)


def check_conditions(spec: BookmarkSpec) -> None:
    """Refuse a spec without conditions, or whose predicates name no function."""
    if not spec.conditions:
        reason = "give a condition: --below, --above, --burst-mbps or --predicate"
        raise BookmarkError(spec.stream, reason)
    if spec.min_samples < 1:
        reason = f"{spec.min_samples} is not a number of samples: give 1 or more"
        msg = "--min-samples"
        raise BookmarkError(msg, reason)
    for c in spec.conditions:
        if c.kind == "predicate":
            _predicate(c.predicate)


#: The columns the bookmark adds to a batch's flattened rows before the conditions see them.
OWN_COLUMNS = ("_time_ns", "_routing_key", "_sensor")


def check_spec(spec: BookmarkSpec, plan: FlattenPlan) -> None:
    """Refuse, before Spark starts, what a batch would refuse: the conditions
    (`check_conditions`), a column of `--below`/`--above`/`--sensor-by` that the rows of
    `plan` lack, a slices stream's name that is no SCOPE/STREAM."""
    check_conditions(spec)
    names = {*plan.arrow_schema.names, *OWN_COLUMNS}
    if spec.sensor_by != "routing_key":
        check_sensor_by(spec.sensor_by, plan.arrow_schema.names)
    for c in spec.conditions:
        if c.kind in ("below", "above") and c.field not in names:
            msg = f"--{c.kind}"
            raise BookmarkError(msg, f"no column {c.field!r} in the rows")
    parse_stream(spec.slices_stream)
    if spec.slices_stream == spec.stream:
        option = "--slices-stream"
        reason = (
            f"{spec.stream} is the stream it bookmarks: its slice records would be read back as "
            "events of that stream (and exported with them); name another stream"
        )
        raise BookmarkError(option, reason)


def check_sensor_by(sensor_by: str, columns: list[str]) -> None:
    """Refuse sensor columns that the flattened rows (`columns`) lack: the bookmark's own
    `_routing_key`, `_time_ns` and `_sensor` are added after the sensors are named."""
    from pipeline.schemas.sensors import sensor_columns

    missing = [c for c in sensor_columns(sensor_by) if c not in columns]
    if not missing:
        return
    said = ", ".join(repr(c) for c in missing)
    reason = f"no column {said} in the rows: name columns of the schema, comma-separated"
    if any(c in OWN_COLUMNS for c in missing):
        reason += " (for the routing key, --sensor-by routing_key)"
    msg = "--sensor-by"
    raise BookmarkError(msg, reason)


# --- one batch ------------------------------------------------------------------------------


class Bookmarker:
    """Applies the conditions to batches of events, in stream order, updating `state`."""

    def __init__(self, spec: BookmarkSpec, plan: FlattenPlan, state: BookmarkState) -> None:
        check_conditions(spec)
        self.spec, self.plan, self.state = spec, plan, state
        self.predicates = {
            c.predicate: _predicate(c.predicate) for c in spec.conditions if c.kind == "predicate"
        }

    def _frame(self, events: pa.Table) -> pd.DataFrame:
        from pipeline.schemas import Events, flatten
        from pipeline.schemas.sensors import sensor_names

        batch = Events.from_arrow(events)
        out = flatten(self.plan, batch)
        sensors = None
        if self.spec.sensor_by != "routing_key":
            check_sensor_by(self.spec.sensor_by, out.rows.column_names)
            # a row with a null among them has no sensor (None): no slice, and no replay, has it
            sensors = sensor_names(out.rows, self.spec.sensor_by).to_numpy(zero_copy_only=False)
        frame = out.rows.to_pandas()
        frame["_time_ns"] = out.time_ns
        keys = dict(
            zip(zip(batch.segments, batch.offsets, strict=True), batch.routing_keys, strict=True)
        )
        frame["_routing_key"] = [
            keys[k] for k in zip(frame["_segment"], frame["_offset"], strict=True)
        ]
        frame["_sensor"] = frame["_routing_key"] if sensors is None else sensors
        self._say_unnamed(frame)
        return frame

    def _say_unnamed(self, frame: pd.DataFrame) -> None:
        """Warn about rows of no sensor (an event without a routing key, or a null among the
        sensor columns): no run, and no slice, holds them."""
        unnamed = frame["_sensor"].isna()
        if not unnamed.any():
            return
        events = frame.loc[unnamed, ["_segment", "_offset"]].drop_duplicates()
        why = (
            "have no routing key"
            if self.spec.sensor_by == "routing_key"
            else f"have a null among the --sensor-by columns {self.spec.sensor_by}"
        )
        remedy = (
            "name sensors by columns (--sensor-by) to bookmark them"
            if self.spec.sensor_by == "routing_key"
            else "name sensors by other columns to bookmark them"
        )
        log.warning(
            "bookmark %s: %s samples of %s events %s: they belong to no sensor and are not "
            "bookmarked; %s",
            self.spec.stream,
            f"{int(unnamed.sum()):,}",
            f"{len(events):,}",
            why,
            remedy,
        )

    def _burst(self, frame: pd.DataFrame, mbps: float) -> np.ndarray:
        """Rows whose rx or tx rate since the sensor's previous sample is above `mbps`."""
        hit = np.zeros(len(frame), dtype=bool)
        for sensor, rows in frame.groupby("_sensor", sort=False):
            t = rows["TimestampNanos"].to_numpy(np.int64)
            counters = rows[["RxBytes", "TxBytes"]].to_numpy(np.int64)
            prev = self.state.last.get(sensor)
            base_t = np.concatenate([[prev[0]] if prev else [t[0]], t[:-1]])
            base_c = np.vstack([[prev[1:]] if prev else counters[:1], counters[:-1]])
            seconds = (t - base_t) / 1e9
            with np.errstate(divide="ignore", invalid="ignore"):
                rates = (counters - base_c) * 8 / 1e6 / seconds[:, None]
            hit[frame.index.get_indexer(rows.index)] = (np.nan_to_num(rates) > mbps).any(axis=1)
            self.state.last[sensor] = [int(t[-1]), *map(int, counters[-1])]
        return hit

    def matches(self, frame: pd.DataFrame) -> np.ndarray:
        hit = np.zeros(len(frame), dtype=bool)
        for c in self.spec.conditions:
            if c.kind in ("below", "above"):
                if c.field not in frame.columns:
                    msg = f"--{c.kind}"
                    raise BookmarkError(msg, f"no column {c.field!r} in the rows")
                compare = operator.lt if c.kind == "below" else operator.gt
                hit |= compare(frame[c.field].to_numpy(), c.value)
            elif c.kind == "burst":
                hit |= self._burst(frame, c.value)
            else:
                hit |= np.asarray(self.predicates[c.predicate](frame), dtype=bool)
        return hit

    def process(self, events: pa.Table, head: StreamCut) -> list[SliceRecord]:
        """The slices the batch closes; `events` are `sluice` source rows in stream order,
        `head` the stream's head now (its segments' first offsets, and its identity, which the
        slices' cuts carry: a slice never reads a later stream of the same name)."""
        if events.num_rows == 0:
            return []
        frame = self._frame(events)
        hit = self.matches(frame)
        times = frame["_time_ns"].to_numpy(np.int64)
        frame["_hit"] = hit
        frame["_t_min"] = np.where(hit, times, np.iinfo(np.int64).max)
        frame["_t_max"] = np.where(hit, times, np.iinfo(np.int64).min)
        per_event = frame.groupby(["_segment", "_offset", "_sensor"], sort=False).agg(
            hit=("_hit", "any"),
            hits=("_hit", "sum"),
            t_min=("_t_min", "min"),
            t_max=("_t_max", "max"),
        )
        positions = zip(events["segment"].to_pylist(), events["offset"].to_pylist(), strict=True)
        ends = dict(zip(positions, events["end_offset"].to_pylist(), strict=True))
        closed = []
        for (segment, offset, sensor), row in per_event.iterrows():
            run = self.state.runs.get(sensor)
            if row["hit"]:
                end = ends[(int(segment), int(offset))]
                self._extend(sensor, int(segment), int(offset), end, row)
            elif run is not None:
                closed.append(self._close(sensor, run, head))
        return [record for record in closed if record is not None]

    def _extend(self, sensor: str, segment: int, offset: int, end: int, row: Any) -> None:
        run = self.state.runs.get(sensor)
        if run is None:
            self.state.runs[sensor] = OpenRun(
                {segment: [offset, end]}, int(row["t_min"]), int(row["t_max"]), int(row["hits"])
            )
            return
        first, _ = run.ranges.get(segment, [offset, end])
        run.ranges[segment] = [first, end]
        run.t_min, run.t_max = min(run.t_min, int(row["t_min"])), max(run.t_max, int(row["t_max"]))
        if run.samples is not None:
            run.samples += int(row["hits"])

    def _close(self, sensor: str, run: OpenRun, head: StreamCut) -> SliceRecord | None:
        """The run's slice, or None for a run with fewer than `min_samples` samples."""
        del self.state.runs[sensor]
        if run.samples is not None and run.samples < self.spec.min_samples:
            return None
        heads = dict(head.segments)
        starts = {**heads, **{s: r[0] for s, r in run.ranges.items()}}
        ends = {**heads, **{s: r[1] for s, r in run.ranges.items()}}
        return SliceRecord.create(
            stream=self.spec.stream,
            sensor=sensor,
            start_cut=head.moved_to(starts),
            end_cut=head.moved_to(ends),
            start_time_ns=run.t_min,
            end_time_ns=run.t_max,
            reason=self.spec.reason,
            created_by=f"sluice run bookmark ({self.spec.name})",
            sensor_by=self.spec.sensor_by,
        )


# --- the job --------------------------------------------------------------------------------


def bookmark_states(root: Path) -> BatchStates[BookmarkState]:
    """The job's state after each batch, as JSON files under `root`."""
    return BatchStates(
        root,
        fresh=BookmarkState,
        load=lambda path: BookmarkState.from_json(path.read_text()),
        save=lambda state, path: path.write_text(state.to_json()),
        suffix=".json",
    )


def process_batch(
    store: StreamStore,
    spec: BookmarkSpec,
    plan: FlattenPlan,
    root: Path,
    *,
    batch_id: int,
    events: pa.Table,
) -> list[SliceRecord]:
    """One micro-batch, idempotently: skip it if its state exists, else record and save."""

    def step(state: BookmarkState) -> list[SliceRecord]:
        bookmarker = Bookmarker(spec, plan, state)
        ordered = events.sort_by([("segment", "ascending"), ("offset", "ascending")])
        closed = bookmarker.process(ordered, store.head(spec.stream))
        record_slices(store, closed, spec.slices_stream)
        return closed

    return bookmark_states(root).run(batch_id, step) or []


def _process_events(
    spec: BookmarkSpec, plan: FlattenPlan, root: Path
) -> Callable[[pa.Table, int], None]:
    """One batch's events (Arrow, the `sluice` source's columns) through `process_batch`: a
    small backlog's batch run without Spark gets this directly (`in_process.py`)."""

    def run_batch(events: pa.Table, batch_id: int) -> None:
        with open_store(spec.store) as store:
            process_batch(store, spec, plan, root, batch_id=batch_id, events=events)

    return run_batch


def _foreach(spec: BookmarkSpec, plan: FlattenPlan, root: Path) -> Callable[[DataFrame, int], None]:
    process = _process_events(spec, plan, root)

    def run_batch(batch: DataFrame, batch_id: int) -> None:
        process(batch.toArrow(), batch_id)

    return run_batch


def bookmark_identity(spec: BookmarkSpec) -> JobIdentity:
    """What the bookmark job's checkpoint records (`job.json`): the stream, with its store,
    and the slices stream (in the same store)."""
    return JobIdentity("bookmark", f"{spec.store}#{spec.stream}", spec.slices_stream)


def bookmark_checkpoint(spec: BookmarkSpec) -> Path:
    """The checkpoint `sluice run bookmark` uses without `--checkpoint` (and the assets)."""
    return default_checkpoint(bookmark_identity(spec), spec.stream, spec.slices_stream)


def bookmark_parameters(spec: BookmarkSpec) -> JobParameters:
    """What a checkpoint's open runs and slices were made with: the sensors, the conditions
    and the minimum (`name` only signs the slices; the schema may evolve)."""
    conditions = [" ".join(c.flags()) for c in spec.conditions]
    flags = (f"--sensor-by {spec.sensor_by}", *conditions, f"--min-samples {spec.min_samples}")
    return JobParameters("bookmark", flags)


#: Why a bookmark's checkpoint refuses other conditions, sensors or minimum
BOOKMARK_CHANGED = (
    "its state holds runs opened under those, which would close as slices of the new ones, "
    "and its slices so far used them"
)
#: How to bookmark with other ones
BOOKMARK_REMEDY = (
    "give a new --checkpoint to use the new ones (with --from head it slices the whole stream "
    "again, beside the slices already recorded)"
)


def bookmark(
    spark: SparkSession,
    spec: BookmarkSpec,
    run: RunOptions,
    report: Callable[[BatchReport], None] = lambda _: None,
) -> JobSummary:
    """Run the bookmark job (see the module doc) until caught up or stopped."""
    from pipeline.schemas import flatten_plan

    identity = bookmark_identity(spec)
    plan = flatten_plan(spec.schema)
    try:
        check_spec(spec, plan)
    except (BookmarkError, InvalidName) as exc:  # in the words a batch would have used
        raise JobFailed(identity.job, str(exc)) from exc
    root = run.checkpoint or bookmark_checkpoint(spec)

    def sink(events: DataFrame, checkpoint: Checkpoint) -> DataStreamWriter:
        process = _foreach(spec, plan, checkpoint.root / "bookmarks")
        return events.writeStream.foreachBatch(process).queryName(f"bookmark {spec.stream}")

    with Checkpoint(root, identity) as checkpoint:
        has_output = any((checkpoint.root / "bookmarks").glob("state-*.json"))
        wanted = bookmark_parameters(spec)
        checkpoint.check_parameters(
            wanted, has_output=has_output, why=BOOKMARK_CHANGED, remedy=BOOKMARK_REMEDY
        )
        checkpoint.note_start(run.starting)
        source = JobSource(spec.store, spec.stream)
        small = events_batch(_process_events(spec, plan, checkpoint.root / "bookmarks"))
        batches = run_query(
            spark, checkpoint, source, run=run, sink=sink, report=report, in_process=small
        )
        outputs = {"slices_stream": spec.slices_stream, "reason": spec.reason}
        return JobSummary("bookmark", str(checkpoint.root), batches, outputs)
