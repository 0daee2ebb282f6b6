"""The drivers: one module per kind of sensor, on the contract in `base.py`, named in
`registry.py`."""
