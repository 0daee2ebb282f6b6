"""The registry: a driver's name, or the Pravega Sensor Collector class name it replaces, to
the module that implements it, and the environment keys that set its options.

`settings.py` and `psc_env.py` look drivers up here. A module is imported only when an
instance uses it, so the MQTT client library is not loaded by a collector that only reads a
network interface.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import cast

from collectors.drivers.base import DriverModule


@dataclass(frozen=True, slots=True)
class DriverSpec:
    """A driver: its name, module, the class names that mean it, and its environment keys.

    `aliases` maps a Pravega Sensor Collector class name to the settings it implies (the CSV
    and Parquet ingest classes are one driver with two formats). `env_keys` maps the suffix
    of a `PRAVEGA_SENSOR_COLLECTOR_<INSTANCE>_<KEY>` variable to the driver's own key.
    """

    name: str
    module: str
    aliases: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    env_keys: Mapping[str, str] = field(default_factory=dict)

    def load(self) -> DriverModule:
        return cast(DriverModule, importlib.import_module(self.module))


_PSC = "io.pravega.sensor.collector."

SPECS: tuple[DriverSpec, ...] = (
    DriverSpec(
        name="nic",
        module="collectors.drivers.nic",
        aliases={"network": {}, _PSC + "network.NetworkDriver": {}},
        env_keys={
            "NETWORK_INTERFACE": "interface",
            "STATISTICS": "statistics",
            "SAMPLES_PER_SEC": "samples_per_sec",
        },
    ),
    DriverSpec(
        name="accelerometer",
        module="collectors.drivers.accelerometer",
        aliases={_PSC + "accelerometer.AccelerometerDriver": {}},
        env_keys={"CONFIG_DEVICE_FILE": "sysfs_dir", "DATA_DEVICE_FILE": "device_file"},
    ),
    DriverSpec(
        name="files",
        module="collectors.drivers.files",
        aliases={
            "csv": {"format": "csv"},
            "parquet": {"format": "parquet"},
            _PSC + "file.csvfile.CsvFileIngestService": {"format": "csv"},
            _PSC + "file.CsvFileIngestService": {"format": "csv"},
            _PSC + "file.parquet.ParquetFileIngestService": {"format": "parquet"},
            _PSC + "parquet.ParquetFileIngestService": {"format": "parquet"},
        },
        env_keys={
            "FILE_SPEC": "directories",
            "FILE_EXTENSION": "extension",
            "DELETE_COMPLETED_FILES": "delete_completed",
            "MIN_TIME_IN_MILLIS_TO_UPDATE_FILE": "settle_ms",
            "INTERVAL_MS": "scan_interval_ms",
        },
    ),
    DriverSpec(name="mqtt", module="collectors.drivers.mqtt"),
    DriverSpec(name="generator", module="collectors.drivers.generator"),
)


def find_spec(class_name: str) -> tuple[DriverSpec, Mapping[str, str]] | None:
    """The driver named by `class_name` (a driver name or an alias) and the settings implied."""
    for spec in SPECS:
        if class_name == spec.name:
            return spec, {}
        if class_name in spec.aliases:
            return spec, spec.aliases[class_name]
    return None


def known_names() -> str:
    return ", ".join(spec.name for spec in SPECS)
