"""Built-in replay models: `module:function`s that take a slice as one pandas DataFrame.

- `pipeline.models.nic:throughput`: receive/transmit rates per second, bursts and idle periods
  of NIC samples (the NIC rate charts, as numbers);
- `pipeline.models.join:join`: the time-series join of two series found in the slice.

A model is `fn(frame, **params) -> DataFrame | (DataFrame, dict)`; the dict is its metrics.
A model may declare `fn.version = "..."`; otherwise its version is a hash of its source.
"""
