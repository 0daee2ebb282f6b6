"""`sluice replay SLICE_ID --model M` and `sluice replay compare`: a model over one slice."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.cli.options import slices_stream_option
from pipeline.cli.progress import Progress, Task
from pipeline.wording import counted

if TYPE_CHECKING:
    from pipeline.jobs.replay import Comparison, OnStep, ReplayStep


def register(subparsers: argparse._SubParsersAction) -> None:

    p = subparsers.add_parser(
        "replay",
        help="run a model over exactly one slice (or compare two models on it)",
        description="sluice replay SLICE_ID --model M  |  "
        "sluice replay compare SLICE_ID --model A --model B. "
        "A model is module:function, optionally followed by ,key=value parameters "
        "(values are JSON, else text): pipeline.models.nic:throughput,burst_mbps=20",
    )
    p.add_argument(
        "words",
        nargs="+",
        metavar="SLICE_ID | compare SLICE_ID",
        help="the slice to replay, or `compare SLICE_ID` to replay it with each --model",
    )
    p.add_argument(
        "--model",
        action="append",
        required=True,
        metavar="MODULE:FUNCTION[,K=V]",
        help="the model and its parameters, e.g. pipeline.models.nic:throughput,burst_mbps=5 "
        "(repeat for compare)",
    )
    p.add_argument(
        "--output",
        type=Path,
        help="output directory (one model only); a relative path is under $SLUICE_HOME, "
        "as for `sluice run export`",
    )
    p.add_argument("--schema", help="Avro schema of the stream (default: from sluice.toml)")
    slices_stream_option(p)
    p.add_argument(
        "--json",
        action="store_true",
        help="compare: print everything as JSON (every metric, sample rows) instead of the "
        "table of what differs",
    )
    p.set_defaults(func=_run_replay)


def parse_model_option(text: str) -> tuple[str, dict]:
    """`module:function,key=value,...` -> (spec, params)."""
    from pipeline.jobs.replay import ModelError

    spec, *pairs = text.split(",")
    params = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise ModelError(spec, f"parameter {pair!r} is not key=value")
        try:
            params[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            params[key.strip()] = value
    return spec.strip(), params


def known_schema(stream: str) -> str | None:
    """The schema sluice.toml names for `stream` (a family's stream or its mirror), if any."""
    from pipeline.settings import load_settings

    for family in load_settings().streams:
        if stream in (family.stream, family.mirror_stream):
            return family.schema
    return None


def _schema_for(stream: str, given: str | None) -> str:
    from pipeline.jobs.replay import UnknownSchema

    schema = given or known_schema(stream)
    if schema is None:
        raise UnknownSchema(stream)
    return schema


def _run_replay(args: argparse.Namespace) -> int:
    from pipeline.config import sluice_home, under_home
    from pipeline.jobs.replay import (
        ReplayError,
        check_readable,
        check_sensor_by,
        compare,
        load_model,
        output_directory,
        replay,
    )
    from pipeline.jobs.slices import find_slice
    from pipeline.schemas import flatten_plan
    from pipeline.spark.session import spark_session
    from pipeline.streams import open_store

    comparing = args.words[0] == "compare"
    if len(args.words) != (2 if comparing else 1):
        msg = "usage: sluice replay SLICE_ID | sluice replay compare SLICE_ID (see --help)"
        raise ReplayError(msg)
    slice_id = args.words[-1]
    check_model_count(len(args.model), comparing, slice_id)
    models = [load_model(*parse_model_option(text)) for text in args.model]
    with (
        open_store(args.store, must_exist=True) as store,
        Progress.of(args).task("replay compare" if comparing else "replay") as task,
    ):
        task.stage(f"finding slice {slice_id}")
        record = find_slice(store, slice_id, args.slices_stream)
        plan = flatten_plan(_schema_for(record.stream, args.schema))
        check_sensor_by(record, plan)  # a column the rows lack: refused before Spark starts
        output = under_home(args.output) if args.output and not comparing else None
        check_readable(store, record)  # a truncated slice: refused before Spark starts
        for model in models:  # a file in the way, a full disk: refused before Spark starts
            output_directory(record, model, sluice_home(), output)
        task.stage("starting Spark")
        spark = spark_session()
        sides = ("a: ", "b: ") if comparing else ("",)
        results = [
            replay(
                spark,
                store,
                slice_id,
                model,
                plan=plan,
                home=sluice_home(),
                output_dir=output,
                slices_stream=args.slices_stream,
                on_step=show_steps(task, side, model.spec),
            )
            for side, model in zip(sides, models, strict=True)
        ]
        if comparing:
            task.stage("comparing the results")
            comparison = compare(*results)
    if comparing:
        if args.json:
            print(json.dumps(comparison.as_dict(), indent=2, default=str))
        else:
            print(comparison_text(comparison))
        return 0
    lineage = results[0].lineage
    print(
        json.dumps(
            {
                "run_id": lineage.run_id,
                "results": lineage.results_path,
                "metrics": lineage.metrics_path,
                "input_events": lineage.input_events,
                "input_rows": lineage.input_rows,
                "output_rows": lineage.output_rows,
                "model_version": lineage.model_version,
                "params": json.loads(lineage.params),
                "params_hash": lineage.params_hash,
            }
        )
    )
    return 0


def check_model_count(given: int, comparing: bool, slice_id: str) -> None:
    """Refuse (`ReplayError`) a number of --model options the command does not take: one
    for a replay, two for a comparison; before any model is loaded."""
    from pipeline.jobs.replay import ReplayError

    wanted = 2 if comparing else 1
    if given == wanted:
        return
    got = f"got {counted(given, '--model option')}"
    if comparing:
        msg = f"sluice replay compare takes two --model options, one per side ({got})"
    else:
        msg = (
            f"sluice replay takes one --model ({got}); to compare two models: "
            f"sluice replay compare {slice_id} --model A --model B"
        )
    raise ReplayError(msg)


def show_steps(task: Task, side: str, model: str) -> OnStep:
    """A replay's steps as the stages of `task` (`side` names the model of a comparison)."""

    def on_step(step: ReplayStep, count: int) -> None:
        if step == "read":
            text = f"reading the slice ({counted(count, 'byte')} between its cuts)"
        elif step == "model":
            text = f"running {model} on {counted(count, 'row')}"
        else:
            text = f"writing {counted(count, 'result row')}"
        task.stage(side + text)

    return on_step


def comparison_text(comparison: Comparison) -> str:
    """Both sides, the metrics that differ as a table, and the rows only one side produced."""
    from pipeline.cli.table import render
    from pipeline.jobs.replay import RUN_KEYS

    lines = [f"slice {comparison.slice_id}"]
    for side, lineage in (("a", comparison.a), ("b", comparison.b)):
        lines.append(
            f"{side}: {lineage.model}@{lineage.model_version} params {lineage.params} "
            f"(run {lineage.run_id}) -> {lineage.results_path}"
        )
    differ = [
        (name, _cell(x), _cell(y))
        for name, x, y in comparison.metrics
        if x != y and name not in RUN_KEYS
    ]
    if comparison.identical:
        lines.append("identical: the same metrics and the same rows")
        return "\n".join(lines)
    if differ:
        lines += ["", render(["metric", "a", "b"], differ, 0)]
    if comparison.columns_differ:
        lines.append("the results have different columns")
    lines.append(f"rows only in a: {comparison.only_a}, only in b: {comparison.only_b}")
    lines.append("(--json for every metric and sample rows)")
    return "\n".join(lines)


def _cell(value: object) -> str:
    return json.dumps(value, default=str) if isinstance(value, dict | list) else str(value)
