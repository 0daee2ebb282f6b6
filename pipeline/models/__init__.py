"""Built-in replay models: `module:function`s that take a slice as one table of rows.

- `pipeline.models.nic:throughput`: receive/transmit rates per second, bursts and idle periods
  of NIC samples (the NIC rate charts, as numbers);
- `pipeline.models.join:join`: the time-series join of two series found in the slice.

A model is `fn(frame, **params) -> DataFrame | (DataFrame, dict)`: `frame` is a pandas
DataFrame of the slice's rows, the dict is its metrics: JSON values (numpy numbers are
taken as numbers; a NaN or infinite metric is kept as null, as JSON has neither). A model may
declare `fn.version = "..."`; otherwise its version is a hash of its source.

A model that sets `fn.takes_arrow = True` is handed the rows as one `pyarrow.Table` instead:
the same columns and order, without a pandas conversion; the per-event columns (scalars,
`_segment`, `_offset`, `_routing_key`) may be dictionary-encoded. It must also take a
DataFrame (what a direct call, or a replay's fallback, passes), may return `NotImplemented`
for a table it does not handle (it is then called with the DataFrame of it), and may return
a `pyarrow.Table` of results where others return a DataFrame.
"""
