"""Where Sluice keeps its state, and where its configuration file is and what it says, raw.

The configuration comes from one place: `sluice.toml` (in the working directory, or
`$SLUICE_CONFIG`) overridden by `SLUICE_*` environment variables, read when asked for, never
at import. Typed, validated settings are made from it in `pipeline/settings.py`."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path


def sluice_home() -> Path:
    """Everything written at run time lives under this directory (`$SLUICE_HOME`, `./.sluice`)."""
    return Path(os.environ.get("SLUICE_HOME") or ".sluice").absolute()


def config_path() -> Path:
    return Path(os.environ.get("SLUICE_CONFIG") or "sluice.toml").absolute()


def load_config(path: Path | None = None) -> dict:
    """The parsed `sluice.toml`, or an empty table when there is none."""
    path = path or config_path()
    if not path.exists():
        return {}
    with path.open("rb") as fh:
        return tomllib.load(fh)


def default_store_uri() -> str:
    """The default (edge) store: `$SLUICE_STORE`, else `$SLUICE_STORE_EDGE`, else sluice.toml's
    `[stores.edge]` (`uri`, or an `embedded` directory under the home), else the embedded
    store in `$SLUICE_HOME/streams`."""
    for variable in ("SLUICE_STORE", "SLUICE_STORE_EDGE"):
        if uri := os.environ.get(variable):
            return uri
    edge = load_config().get("stores", {}).get("edge", {})
    if uri := edge.get("uri"):
        return str(uri)
    if directory := edge.get("embedded"):
        return f"embedded:{(sluice_home() / Path(directory).expanduser()).absolute()}"
    return f"embedded:{sluice_home() / 'streams'}"
