"""The drivers: one module per kind of sensor (nic, accelerometer, files, mqtt, generator).

A new driver is a module here that imports only the contract in `base.py` (and the helpers
`collectors.batch`, `tabular`, `nic_sampler`), provides `parse_options` and `create`, and is
named in `registry.py` (with the Pravega Sensor Collector class names it replaces).
"""
