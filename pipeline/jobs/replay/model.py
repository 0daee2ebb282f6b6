"""The model a replay runs: `module:function` imported, its parameters bound and made
canonical (so equal values are one replay), called on the slice's rows, and its results and
metrics checked into what a replay keeps. The model contract: `pipeline/models/__init__.py`."""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import inspect
import json
import math
import sys
import traceback
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Union, get_origin

import pyarrow as pa

from pipeline.jobs.replay.errors import ModelError

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True, slots=True)
class Model:
    """A model named `module:function`, its code version and parameters: every keyword it
    takes, the defaults of its signature included (so leaving out a default and passing it
    are the same replay)."""

    spec: str
    function: Callable[..., Any]
    version: str
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def slug(self) -> str:
        return self.spec.replace(":", ".")

    @property
    def params_text(self) -> str:
        """The parameters as canonical JSON (sorted keys): what `params_hash` hashes."""
        return params_text(self.params)

    @property
    def params_hash(self) -> str:
        return hash_params_text(self.params_text)


def params_text(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, default=str)


def hash_params_text(text: str) -> str:
    """`sha256:<64 hex>` of the canonical parameter text."""
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def load_model(spec: str, params: dict[str, Any] | None = None) -> Model:
    """Import `module:function`. Its version is the function's `version` attribute if it
    declares one, else `sha256:` of its module's source (any code change is a new version)."""
    module_name, colon, name = spec.partition(":")
    if not colon or not module_name or not name:
        raise ModelError(spec, "name it as module:function, e.g. pipeline.models.nic:throughput")
    try:
        with contextlib.redirect_stdout(sys.stderr):  # standard output is the command's
            module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ModelError(spec, f"cannot import {module_name} ({exc})") from None
    except Exception as exc:  # the module's own code: a syntax error, a raise at import
        reason = f"importing {module_name} raised {_described(exc)}"
        raise ModelError(spec, reason, model_trace(exc)) from None
    function = getattr(module, name, None)
    if not callable(function):
        raise ModelError(spec, f"{module_name} has no function {name!r}")
    declared = getattr(function, "version", None)
    if declared is not None:
        version = str(declared)
    else:
        source = inspect.getsource(module).encode()
        version = "sha256:" + hashlib.sha256(source).hexdigest()[:16]
    return Model(spec, function, version, _bind_params(spec, function, dict(params or {})))


def _bind_params(spec: str, function: Callable[..., Any], params: dict[str, Any]) -> dict:
    """The keywords the model will get: `params`, each as the type the function expects
    (`canonical_value`), plus its signature's defaults."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # a builtin or C function: take the params as given
        return params
    with contextlib.suppress(Exception):  # annotations as types, where they evaluate here
        signature = inspect.signature(function, eval_str=True)
    positional = {inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD}
    positional.add(inspect.Parameter.VAR_POSITIONAL)
    if not any(p.kind in positional for p in signature.parameters.values()):
        reason = "takes no argument for the slice's rows: a model is function(frame, **params)"
        raise ModelError(spec, reason)
    params = {
        name: canonical_value(spec, signature.parameters[name], value)
        if name in signature.parameters
        else value
        for name, value in params.items()
    }
    try:
        bound = signature.bind(None, **params)
    except TypeError as exc:
        names = [p for p in list(signature.parameters)[1:]]
        reason = f"parameters {sorted(params)} do not fit it ({exc}; it takes {names})"
        raise ModelError(spec, reason) from None
    bound.apply_defaults()
    first = next(iter(signature.parameters))
    effective: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        kind = signature.parameters[name].kind
        if name == first:
            continue
        if kind is inspect.Parameter.VAR_KEYWORD:
            effective.update(value)
        elif kind is not inspect.Parameter.VAR_POSITIONAL:
            effective[name] = value
    return effective


def canonical_value(spec: str, parameter: inspect.Parameter, value: Any) -> Any:
    """`value` as the type of `parameter`'s default (else of its annotation, `float | None`),
    so that equal values are one replay: `995` for a float is `995.0`, `3.0` for an int is
    `3`, a whole number for text is its digits. A value that is not of that type, or would
    change in the conversion (`3.5` for an int, `true` for a number), is a `ModelError`
    naming the parameter and the type. Parameters of other types are taken as given."""
    default = parameter.default
    if default is not inspect.Parameter.empty and default is not None:
        kinds = (type(default),)
    else:
        annotation = parameter.annotation
        union = isinstance(annotation, types.UnionType) or get_origin(annotation) is Union
        kinds = tuple(annotation.__args__) if union else (annotation,)
        kinds = tuple(None if kind is type(None) else kind for kind in kinds)
        if value is None and (default is None or None in kinds):
            return None
    if type(value) in kinds:
        return value
    for kind in (bool, int, float, str):
        if kind not in kinds:
            continue
        converted = _converted(kind, value)
        if converted is not _UNCONVERTIBLE:
            return converted
    if not any(kind in kinds for kind in (bool, int, float, str)):
        return value
    wanted = " or ".join(_TYPE_NAMES[k] for k in (bool, int, float, str, None) if k in kinds)
    reason = f"parameter {parameter.name}={value!r} is not {wanted}"
    if default is not inspect.Parameter.empty:
        reason += f" (its default is {default!r})"
    raise ModelError(spec, reason)


_UNCONVERTIBLE = object()
_TYPE_NAMES = {
    bool: "true or false",
    int: "a whole number",
    float: "a number",
    str: "text",
    None: "null",
}


def _converted(kind: type, value: Any) -> Any:
    """`value` as `kind` when that changes nothing but its type; else `_UNCONVERTIBLE`."""
    if kind is bool or isinstance(value, bool):  # a bool is an int to Python, not to a model
        return value if kind is bool and isinstance(value, bool) else _UNCONVERTIBLE
    if kind is float and isinstance(value, int):
        return float(value)
    if kind is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if kind is str and isinstance(value, int):  # `--model m,name=123`: JSON made it a number
        return str(value)
    return _UNCONVERTIBLE


def takes_arrow(model: Model) -> bool:
    """True when the model declares `takes_arrow = True`: it is handed the slice's rows as
    a `pyarrow.Table` rather than a pandas DataFrame (`pipeline.models`)."""
    return getattr(model.function, "takes_arrow", False) is True


def run_model(model: Model, rows: pa.Table | pd.DataFrame) -> tuple[pa.Table, dict[str, Any]]:
    """Call the model on the rows: a pandas model gets a DataFrame (dictionary columns
    decoded), an Arrow model (`takes_arrow`) the table, or the DataFrame it is given; one
    that returns `NotImplemented` for a table is called again with its DataFrame. What it
    prints goes to standard error (standard output is the command's). Returns its results
    as an Arrow table (no pandas index, no schema metadata) and its metrics as JSON values;
    a model that raises, or returns what a replay cannot keep, is a `ModelError`."""
    from pipeline.spark.replay_reader import decoded

    with contextlib.redirect_stdout(sys.stderr):
        out = NotImplemented
        if isinstance(rows, pa.Table) and takes_arrow(model):
            out = _call(model, rows)
        if out is NotImplemented:
            frame = decoded(rows).to_pandas() if isinstance(rows, pa.Table) else rows
            out = _call(model, frame)
    results, metrics = out if isinstance(out, tuple) and len(out) == 2 else (out, {})
    return _results_table(model.spec, results, metrics), _json_metrics(model.spec, metrics)


#: Columns the analytics `replays` view adds to each result row (from its lineage record,
#: and DuckDB's `filename`): a model's results cannot have columns of these names.
VIEW_COLUMNS = ("run_id", "slice_id", "model", "model_version", "params_hash", "filename")


def _call(model: Model, rows: pa.Table | pd.DataFrame) -> Any:
    try:
        return model.function(rows, **model.params)
    except (Exception, SystemExit) as exc:  # `sys.exit()` in a model ends no replay silently
        raise ModelError(model.spec, f"raised {_described(exc)}", model_trace(exc)) from None


def _results_table(spec: str, results: Any, metrics: Any) -> pa.Table:
    """The model's results as an Arrow table a Parquet file and the `replays` view hold."""
    import pandas as pd

    if not isinstance(results, pd.DataFrame | pa.Table) or not isinstance(metrics, dict):
        got = f"({type(results).__name__}, {type(metrics).__name__})"
        reason = f"must return a pandas DataFrame or pyarrow Table, or (that, dict), not {got}"
        raise ModelError(spec, reason)
    if isinstance(results, pd.DataFrame):
        try:
            results = pa.Table.from_pandas(results.reset_index(drop=True), preserve_index=False)
        except (pa.ArrowException, ValueError) as exc:
            found = "; ".join(map(str, exc.args))  # pyarrow: (what failed, in which column)
            reason = f"its results cannot be written as Parquet ({found}): give each column "
            raise ModelError(spec, reason + "one type, and unique names") from None
    names = results.schema.names
    if not names:
        reason = (
            "returned a table without columns: an empty result is its columns without rows, "
            "e.g. pd.DataFrame(columns=[...])"
        )
        raise ModelError(spec, reason)
    if clashing := sorted({n for n in names if n in VIEW_COLUMNS or names.count(n) > 1}):
        reason = (
            f"its results have columns {clashing}, which are repeated or named as the "
            f"`replays` view's own ({', '.join(VIEW_COLUMNS)}): rename them"
        )
        raise ModelError(spec, reason)
    if "time" in names and not _is_time(results.schema.field("time").type):
        reason = (
            f"its `time` column holds {results.schema.field('time').type}, not timestamps: the "
            "`replays` view reads it as each result's time. Give it timestamps (e.g. "
            "pd.to_datetime(frame._time_ns, utc=True)) or another name"
        )
        raise ModelError(spec, reason)
    return results.replace_schema_metadata(None)


def _is_time(arrow_type: pa.DataType) -> bool:
    return pa.types.is_timestamp(arrow_type) or pa.types.is_date(arrow_type)


def _json_metrics(spec: str, metrics: dict[str, Any]) -> dict[str, Any]:
    """The metrics as the JSON values `metrics.json` holds (numpy numbers as Python's). JSON
    has no NaN or infinity: such a metric (a mean of no rows) is kept as null, and standard
    error names it."""

    import numpy as np

    def plain(value: Any) -> Any:
        if isinstance(value, np.generic):
            return value.item()
        msg = f"a {type(value).__name__}: {value!r}"
        raise TypeError(msg)

    try:
        values = json.loads(json.dumps(metrics, default=plain))
    except (TypeError, ValueError) as exc:
        reason = f"its metrics hold a value that is not JSON ({exc}): return numbers, text, "
        raise ModelError(spec, reason + "true/false, null, and lists and dicts of them") from None
    nulled: list[tuple[str, str]] = []
    values = _finite(values, "", nulled)
    if nulled:
        named = ", ".join(f"{where} ({value})" for where, value in nulled)
        print(
            f"model {spec}: metrics kept as null (JSON has no NaN or infinity): {named}",
            file=sys.stderr,
        )
    return values


def _finite(value: Any, where: str, nulled: list[tuple[str, str]]) -> Any:
    """`value` with each NaN or infinite float replaced by None, its place noted in `nulled`."""
    if isinstance(value, float) and not math.isfinite(value):
        nulled.append((where, repr(value)))
        return None
    if isinstance(value, dict):
        return {k: _finite(v, f"{where}.{k}" if where else k, nulled) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v, f"{where}[{i}]", nulled) for i, v in enumerate(value)]
    return value


def _described(exc: BaseException) -> str:
    """`Type: first line of the message`: an exception on one line."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def model_trace(exc: BaseException) -> str:
    """The traceback of `exc` from the model's own code on: the frames of Sluice's call and
    of Python's import machinery left out (a syntax error keeps its file, line and caret)."""
    tb = exc.__traceback__
    while tb is not None and _not_the_models(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb)).rstrip()


def _not_the_models(filename: str) -> bool:
    return filename in (__file__, importlib.__file__) or filename.startswith("<frozen ")
