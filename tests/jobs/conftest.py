"""Helpers of the job tests: Spark checkpoint files as a killed run leaves them."""

from __future__ import annotations

from pathlib import Path


def cut_short_write(log_dir: Path, batch_id: int) -> list[Path]:
    """What a run killed while Spark wrote entry `batch_id` of a metadata log (`offsets/`,
    `commits/`) leaves: the temporary file of the write, and its checksum file on a local
    disk."""
    log_dir.mkdir(parents=True, exist_ok=True)
    tmp = log_dir / f".{batch_id}.5d7c5b0e-0d55-4a39-9e1b-6f0f3f1c9a11.tmp"
    tmp.write_text("v1\n")
    crc = log_dir / f".{tmp.name}.crc"
    crc.write_bytes(b"crc\x00")
    return [tmp, crc]
