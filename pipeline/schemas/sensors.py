"""Which sensor a flattened row belongs to, when slices name sensors by columns of the rows.

    names = sensor_names(rows, "RemoteAddr,Interface")    # "ubuntu/ens33", ... (Arrow strings)

The bookmark job names the sensor of each row with this, and a replay keeps the rows whose
name is the slice's, so the two agree by construction: each column's values as Arrow casts
them to text (`1.5`, `true`, `7`), joined with `/`; null where any of the columns is null (such
a row belongs to no sensor). Of several columns, a value's own `\\` and `/` are escaped
(`\\\\`, `\\/`), so two sensors never share a name (`a/b` + `c` is `a\\/b/c`, `a` + `b/c` is
`a/b\\/c`); values that hold neither give their plain join, and one column's values are the
names as they are. Vectorized: a batch of a million samples takes milliseconds.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.errors import SluiceError

#: Joins the columns' values into a sensor's name; `ESCAPE` comes before a value's own.
SEPARATOR, ESCAPE = "/", "\\"


class UnknownSensorColumns(SluiceError, KeyError):
    """Columns a `sensor_by` names that the rows (`of`: e.g. "the rows of NetworkSamples")
    do not have. A `KeyError`, as a missing column is, but shown as its message: a plain
    `KeyError` shows its argument quoted."""

    def __init__(self, sensor_by: str, missing: list[str], columns: list[str], of: str) -> None:
        self.sensor_by, self.missing, self.columns, self.of = sensor_by, missing, columns, of
        said = ", ".join(repr(c) for c in missing)
        msg = (
            f"--sensor-by {sensor_by!r}: {of} have no column {said} (their columns: "
            f"{', '.join(columns)}): name columns of the schema, comma-separated, or "
            "routing_key"
        )
        super().__init__(msg)

    def __str__(self) -> str:
        return str(self.args[0])


def sensor_columns(sensor_by: str) -> list[str]:
    """The column names of a `sensor_by` text (`RemoteAddr, Interface` -> two names)."""
    return [name.strip() for name in sensor_by.split(",")]


def missing_columns(sensor_by: str, columns: Sequence[str]) -> list[str]:
    """The columns `sensor_by` names that are not among `columns`."""
    return [name for name in sensor_columns(sensor_by) if name not in columns]


def check_sensor_columns(sensor_by: str, columns: Sequence[str], of: str = "the rows") -> None:
    """Refuse (`UnknownSensorColumns`) a `sensor_by` naming a column not in `columns`."""
    missing = missing_columns(sensor_by, columns)
    if missing:
        raise UnknownSensorColumns(sensor_by, missing, list(columns), of)


def sensor_name(values: list[str]) -> str:
    """The name of the sensor whose columns' values (as text) are `values`: what
    `sensor_names` gives their row, for a person who names a sensor by hand."""
    if len(values) == 1:
        return values[0]
    return SEPARATOR.join(_escape_text(value) for value in values)


def _escape_text(value: str) -> str:
    return value.replace(ESCAPE, ESCAPE * 2).replace(SEPARATOR, ESCAPE + SEPARATOR)


def _escape(column: pa.Array) -> pa.Array:
    column = pc.replace_substring(column, ESCAPE, ESCAPE * 2)
    return pc.replace_substring(column, SEPARATOR, ESCAPE + SEPARATOR)


def sensor_names(rows: pa.Table, sensor_by: str) -> pa.Array:
    """The sensor of each row of `rows`: its `sensor_by` columns as text (escaped, when there
    are several) joined with `/`, or null where one of them is null. A column the rows do
    not have is an `UnknownSensorColumns` (a `KeyError`)."""
    check_sensor_columns(sensor_by, rows.column_names)
    parts = []
    for name in sensor_columns(sensor_by):
        column = rows.column(name).combine_chunks()
        if pa.types.is_dictionary(column.type):
            column = column.dictionary_decode()
        parts.append(pc.cast(column, pa.string()))
    if len(parts) == 1:
        return parts[0]
    return pc.binary_join_element_wise(*map(_escape, parts), SEPARATOR)
