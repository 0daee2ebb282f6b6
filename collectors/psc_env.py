"""The Pravega Sensor Collector's environment variables, read as collector instances.

`PRAVEGA_SENSOR_COLLECTOR_<INSTANCE>_CLASS` names a driver; every other
`PRAVEGA_SENSOR_COLLECTOR_<INSTANCE>_<KEY>` sets an option of that instance, and
`PRAVEGA_SENSOR_COLLECTOR_<KEY>` without an instance sets it for every instance (as its
`DeviceDriverManager` does). Keys keep their Pravega Sensor Collector names (`SCOPE`, `STREAM`,
`NETWORK_INTERFACE`, `PERSISTENT_QUEUE_FILE`, `FILE_SPEC`, ...: `COMMON_KEYS` and each driver's
`env_keys` in the registry); any Sluice key may also be given upper-case (`..._WHEN_FULL=shed`).
Read from the mapping passed in, when asked, never from `os.environ` at import.
"""

from __future__ import annotations

from collections.abc import Mapping

from collectors.drivers.registry import find_spec, known_names
from collectors.errors import ConfigError
from collectors.options import Option

PREFIX = "PRAVEGA_SENSOR_COLLECTOR_"
_CLASS = "CLASS"

#: Pravega Sensor Collector keys every instance understands, and the Sluice key each sets.
COMMON_KEYS: Mapping[str, str] = {
    "CLASS": "driver",
    "SCOPE": "scope",
    "STREAM": "stream",
    "ROUTING_KEY": "routing_key",
    "SAMPLES_PER_EVENT": "samples_per_event",
    "PERSISTENT_QUEUE_FILE": "buffer_file",
    "DATABASE_FILE": "buffer_file",
    "PERSISTENT_QUEUE_CAPACITY_EVENTS": "capacity_events",
    "MAX_EVENTS_PER_WRITE_BATCH": "max_events_per_txn",
    "DELAY_BETWEEN_WRITE_BATCHES_MS": "linger_ms",
    "PRAVEGA_CONTROLLER_URI": "store",
    "TRANSACTION_TIMEOUT_MINUTES": "transaction_timeout_minutes",
    "EXACTLY_ONCE": "exactly_once",
    "CREATE_SCOPE": "create_scope",
    "MEMORY_QUEUE_CAPACITY_ELEMENTS": "memory_queue_capacity_elements",
    "ENABLE_LARGE_EVENT": "enable_large_event",
}


def instances_from_env(environ: Mapping[str, str]) -> dict[str, dict[str, Option]]:
    """Instance name -> its settings (Sluice key -> value and the variable it came from)."""
    ours = {k: v for k, v in environ.items() if k.startswith(PREFIX)}
    names = sorted(
        (k[len(PREFIX) : -len(_CLASS) - 1] for k in ours if k.endswith("_" + _CLASS)),
        key=len,
        reverse=True,
    )
    names = [n for n in names if n]
    shared: dict[str, Option] = {}
    own: dict[str, dict[str, Option]] = {name: {} for name in names}
    for key, value in ours.items():
        rest = key[len(PREFIX) :]
        owner = next((n for n in names if rest.startswith(n + "_")), None)
        if owner is None:
            shared[rest] = Option(value, key)
        else:
            own[owner][rest[len(owner) + 1 :]] = Option(value, key)
    if shared and not names:
        listed = ", ".join(s.origin for s in shared.values())
        msg = "environment"
        raise ConfigError(
            msg,
            f"{listed} set but no PRAVEGA_SENSOR_COLLECTOR_<INSTANCE>_CLASS",
            "name a driver class for each instance",
        )
    return {name: _translate(name, {**shared, **own[name]}) for name in sorted(names)}


def _translate(instance: str, raw: dict[str, Option]) -> dict[str, Option]:
    class_setting = raw[_CLASS]
    found = find_spec(class_setting.value.strip())
    if found is None:
        msg = f"instance {instance}"
        raise ConfigError(
            msg,
            f"{class_setting.origin} = {class_setting.value!r} is not a known driver class",
            f"use one of {known_names()} (or a Pravega Sensor Collector class name they replace)",
        )
    spec, _ = found
    table: dict[str, Option] = {}
    for key, setting in raw.items():
        name = COMMON_KEYS.get(key) or spec.env_keys.get(key) or key.lower()
        if name in table:
            msg = f"instance {instance}"
            raise ConfigError(
                msg,
                f"{setting.origin} and {table[name].origin} both set {name}",
                "keep one of them",
            )
        table[name] = setting
    return table


def variable_names(instance: str, env_keys: Mapping[str, str]) -> dict[str, str]:
    """Option -> `key (PRAVEGA_SENSOR_COLLECTOR_<INSTANCE>_<KEY>)`, to name missing ones."""
    names: dict[str, str] = {}
    for env_key, key in [*COMMON_KEYS.items(), *env_keys.items()]:
        names.setdefault(key, f"{key} ({PREFIX}{instance}_{env_key})")
    return names
