"""Options: one table of raw options read into typed values, with one clear line for a bad one.

A table is the `[collector]` or an `[instances.NAME]` table of `collector.toml` (typed TOML
values) or one instance's Pravega Sensor Collector environment variables (strings). Each
`Option` remembers where it was set, so an error names the exact key or variable to fix.
Every driver reads its own keys through an `OptionsReader` (its `parse_options`, see
`drivers/base.py`); `finish()` refuses keys nobody asked for, so a misspelt key is an error
at start-up, not a silently ignored default.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from collectors.errors import ConfigError

_MISSING = object()
_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


@dataclass(frozen=True, slots=True)
class Option:
    """A raw value and where it was set (`collector.toml key` or `ENV_VAR`)."""

    value: Any
    origin: str


class OptionsReader:
    """Typed access to one table of options; `where` names the table in error messages."""

    def __init__(
        self, where: str, table: Mapping[str, Option], names: Mapping[str, str] | None = None
    ) -> None:
        self.where = where
        self._table = dict(table)
        self._names = dict(names or {})  # how to name a missing key (its variable, say)
        self._used: set[str] = set()

    def has(self, key: str) -> bool:
        return key in self._table

    def origin(self, key: str) -> str:
        setting = self._table.get(key)
        return setting.origin if setting else key

    def _get(self, key: str, default: Any) -> Any:
        self._used.add(key)
        if key in self._table:
            return self._table[key].value
        if default is _MISSING:
            self.fail(key, "is required but not set")
        return default

    def fail(self, key: str, problem: str, hint: str = "", show_value: bool = True) -> NoReturn:
        """Raise `ConfigError` about `key` (named as the user wrote it; its value too, unless
        `show_value` is false: a secret is never printed)."""
        setting = self._table.get(key)
        if setting is not None and show_value:
            problem = f"{setting.origin} = {_as_written(setting.value)} {problem}"
        elif setting is not None:
            problem = f"{setting.origin} {problem}"
        else:
            problem = f"{self._names.get(key, key)} {problem}"
        raise ConfigError(self.where, problem, hint)

    def text(self, key: str, default: Any = _MISSING) -> str:
        value = self._get(key, default)
        if value is None:
            return value
        if not isinstance(value, str) or (not value.strip() and default is _MISSING):
            self.fail(key, "must be a non-empty text")
        return value.strip()

    def character(self, key: str, default: str) -> str:
        """One character, taken as it is (a tab or a space is a character, not blank)."""
        value = self._get(key, default)
        if not isinstance(value, str) or len(value) != 1:
            self.fail(key, "must be one character")
        return value

    def secret(self, key: str, default: Any = _MISSING) -> str:
        """A text that is never shown: a wrong value is reported by its key and type only."""
        value = self._get(key, default)
        if value is None:
            return value
        if not isinstance(value, str) or not value:
            kind = type(value).__name__
            problem = f"must be a non-empty text (a {kind} was given; the value is not shown)"
            self.fail(key, problem, "quote it in the TOML file", show_value=False)
        return value

    def integer(self, key: str, default: Any = _MISSING, minimum: int | None = None) -> int:
        value = self._get(key, default)
        if isinstance(value, str):
            try:
                value = int(value.strip().replace("_", ""))
            except ValueError:
                self.fail(key, "is not a whole number")
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(key, "is not a whole number")
        if minimum is not None and value < minimum:
            self.fail(key, f"must be at least {minimum}")
        return value

    def number(self, key: str, default: Any = _MISSING, positive: bool = False) -> float:
        value = self._get(key, default)
        if isinstance(value, str):
            try:
                value = float(value.strip())
            except ValueError:
                self.fail(key, "is not a number")
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.fail(key, "is not a number")
        if not math.isfinite(value):
            self.fail(key, "must be a finite number")
        if positive and value <= 0:
            self.fail(key, "must be greater than 0")
        if value < 0:
            self.fail(key, "must not be negative")
        return float(value)

    def flag(self, key: str, default: Any = _MISSING) -> bool:
        value = self._get(key, default)
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        if not isinstance(value, bool):
            self.fail(key, "is not true or false")
        return value

    def choice(
        self, key: str, choices: tuple[str, ...], default: Any = _MISSING, hint: str = ""
    ) -> str:
        value = self.text(key, default)
        if value not in choices:
            self.fail(key, f"is not one of {', '.join(choices)}", hint)
        return value

    def texts(self, key: str, default: Any = _MISSING) -> tuple[str, ...]:
        """A TOML list of texts, or a comma-separated text (the environment's form)."""
        value = self._get(key, default)
        if isinstance(value, str):
            value = [part for part in (p.strip() for p in value.split(",")) if part]
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            self.fail(key, "must be a list of texts (or one comma-separated text)")
        if not value:
            self.fail(key, "must not be empty")
        return tuple(v.strip() for v in value)

    def path(self, key: str, default: Any = _MISSING) -> Path:
        value = self._get(key, default)
        if isinstance(value, Path):
            return value
        if not isinstance(value, str) or not value.strip():
            self.fail(key, "must be a path")
        return Path(value.strip()).expanduser()

    def finish(self, known_hint: str = "") -> None:
        """Refuse any key that no one read."""
        unknown = sorted(set(self._table) - self._used)
        if unknown:
            names = ", ".join(self._table[k].origin for k in unknown)
            raise ConfigError(self.where, f"unknown setting {names}", known_hint)


def from_toml(table: Mapping[str, Any], prefix: str) -> dict[str, Option]:
    """Wrap a TOML table's values with their origin (`prefix.key`)."""
    return {key: Option(value, f"{prefix}.{key}") for key, value in table.items()}


def _as_written(value: Any) -> str:
    """A setting's value as a TOML file spells it where Python's repr does not (`true`, not
    `True`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)
