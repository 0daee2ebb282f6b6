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

import pyarrow as pa
import pyarrow.compute as pc

#: Joins the columns' values into a sensor's name; `ESCAPE` comes before a value's own.
SEPARATOR, ESCAPE = "/", "\\"


def sensor_columns(sensor_by: str) -> list[str]:
    """The column names of a `sensor_by` text (`RemoteAddr, Interface` -> two names)."""
    return [name.strip() for name in sensor_by.split(",")]


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
    are several) joined with `/`, or null where one of them is null. `KeyError` names a column
    the rows do not have."""
    parts = []
    for name in sensor_columns(sensor_by):
        if name not in rows.column_names:
            raise KeyError(name)
        column = rows.column(name).combine_chunks()
        if pa.types.is_dictionary(column.type):
            column = column.dictionary_decode()
        parts.append(pc.cast(column, pa.string()))
    if len(parts) == 1:
        return parts[0]
    return pc.binary_join_element_wise(*map(_escape, parts), SEPARATOR)
