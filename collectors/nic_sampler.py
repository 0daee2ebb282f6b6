"""The NIC driver's sampling process: reads counters on a monotonic schedule, nothing else.

    python -m collectors.nic_sampler RATE PRIORITY SLICE_US PATH [PATH ...]

Its own small process (standard library only), so nothing the collector does can delay a
wake-up. At normal priority (PRIORITY 0) it asks the scheduler for a time slice of SLICE_US
microseconds (0: the kernel's default); see `request_slice`. Each sample goes to stdout as a
little-endian record: int64 wall-clock nanoseconds, then one uint64 per counter (the kernel's
counters are unsigned 64-bit); a time of -1 carries the number of ticks missed after a stall.
An unreadable counter (missing, empty, not a whole number from 0 to 2**64 - 1): the reason on
stderr, exit status 3 (4: SCHED_FIFO not permitted). It dies with its parent
(PR_SET_PDEATHSIG), and on a closed pipe.
"""

from __future__ import annotations

import ctypes
import os
import signal
import struct
import sys
import threading
import time

from collectors.pacing import Pacer

EXIT_UNREADABLE = 3
EXIT_NO_PRIORITY = 4
WRITE_EVERY = 25  # records per write: the driver wakes 40 times a second at 1 kHz, not 1000
MISSED = -1
#: sched_setattr(2) by machine (the os module has no wrapper for it).
_SCHED_SETATTR = {"x86_64": 314, "i686": 351, "aarch64": 274, "riscv64": 274, "armv7l": 380}
_SCHED_ATTR = struct.Struct("<IIQiIQQQ")  # struct sched_attr, version 0 (48 bytes)
_SCHED_FLAG_KEEP_POLICY = 0x08
COUNTER_LIMIT = 1 << 64  # sysfs counters are u64 (32-bit ones wrap earlier, and are kept as read)
_LONGEST_TEXT = 64  # a u64 is 20 digits; more than this is not a counter
_PR_SET_PDEATHSIG = 1


def record_format(counters: int) -> struct.Struct:
    return struct.Struct(f"<q{counters}Q")


def parse_counter(text: bytes) -> int:
    """A sysfs counter's value: ASCII digits (and surrounding white space) for 0 .. 2**64 - 1;
    anything else (empty, a sign, garbage, too long) raises ValueError saying what was read."""
    digits = text.strip()
    if not digits.isdigit() or len(text) >= _LONGEST_TEXT or int(digits) >= COUNTER_LIMIT:
        shown = text[:_LONGEST_TEXT]
        msg = f"{shown!r} is not a counter value (a whole number from 0 to 2**64 - 1)"
        raise ValueError(msg)
    return int(digits)


def read_counter(fd: int) -> int:
    return parse_counter(os.pread(fd, _LONGEST_TEXT, 0))


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: the closed pipe still ends us


def request_slice(slice_us: int) -> bool:
    """Ask Linux's scheduler (EEVDF, 6.12 on) for time slices of `slice_us` for this process,
    which stays at normal priority: no privilege is needed.

    A waking task preempts a busy one only once that one's slice is used up (about 1.4 ms by
    default), unless the waking task's own slice is shorter. So, with every core busy, a
    wake-up can come more than the 1 ms between samples late, and the tick is skipped. A
    short slice lets the sampler run when it wakes. It sleeps between samples, so it takes
    no more CPU. Best effort: False where the call is unknown (another OS or machine) or
    refused; an older kernel takes the call and keeps its default slice."""
    number = _SCHED_SETATTR.get(os.uname().machine) if sys.platform == "linux" else None
    if number is None:
        return False
    nice = os.getpriority(os.PRIO_PROCESS, 0)  # kept as it is (the call sets it too)
    runtime_ns = slice_us * 1000  # sched_runtime: a fair task's slice
    attr = _SCHED_ATTR.pack(_SCHED_ATTR.size, 0, _SCHED_FLAG_KEEP_POLICY, nice, 0, runtime_ns, 0, 0)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(number, 0, ctypes.create_string_buffer(attr, len(attr)), 0) == 0
    except (OSError, AttributeError):
        return False


def main(argv: list[str]) -> int:
    rate, priority, slice_us, paths = float(argv[0]), int(argv[1]), int(argv[2]), argv[3:]
    _die_with_parent()
    if not priority and slice_us:
        request_slice(slice_us)
    if priority:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
        except PermissionError:
            sys.stderr.write(
                f"no permission for SCHED_FIFO priority {priority} (grant CAP_SYS_NICE or "
                "raise RLIMIT_RTPRIO, as the systemd unit's LimitRTPRIO does)"
            )
            return EXIT_NO_PRIORITY
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:  # O_NONBLOCK: a FIFO or a device node in place of a counter cannot hang us
        fds = [os.open(path, os.O_RDONLY | os.O_NONBLOCK) for path in paths]
    except OSError as exc:
        sys.stderr.write(f"{exc}\n")
        return EXIT_UNREADABLE
    pack = record_format(len(fds)).pack
    out = sys.stdout.fileno()
    pacer = Pacer(1.0 / rate)
    missed = 0
    pending: list[bytes] = []
    status = 0
    while pacer.wait(stop):
        now_ns = time.time_ns()
        try:
            values = _read_all(fds, paths)
        except ValueError as exc:
            sys.stderr.write(f"{exc}\n")
            status = EXIT_UNREADABLE
            break
        if pacer.missed != missed:
            pending.append(pack(MISSED, pacer.missed - missed, *[0] * (len(fds) - 1)))
            missed = pacer.missed
        pending.append(pack(now_ns, *values))
        if len(pending) >= WRITE_EVERY and not _write(out, pending):
            return 0
    _write(out, pending)
    return status


def _read_all(fds: list[int], paths: list[str]) -> list[int]:
    """Every counter's value now; ValueError naming the first that cannot be read."""
    values = []
    for fd, path in zip(fds, paths, strict=True):
        try:
            values.append(read_counter(fd))
        except (OSError, ValueError) as exc:
            msg = f"{path}: {exc}"
            raise ValueError(msg) from None
    return values


def _write(out: int, records: list[bytes]) -> bool:
    """Write and clear `records`; False once the reader is gone."""
    try:
        os.write(out, b"".join(records))
    except BrokenPipeError:
        return False
    records.clear()
    return True


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
