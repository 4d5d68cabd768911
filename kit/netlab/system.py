"""The lab's floor: errors, rates and the system commands (ip, tc) every part of kit.netlab runs."""
from __future__ import annotations

import math
import re
import subprocess

UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9}
# tc counts a rate in whole bytes per second (below 8 bit/s it reads 0 and refuses), and a tbf burst of 2 ms must fit
# its 32-bit byte count: the kit allows 8bit to 1000gbit.
MIN_BITS, MAX_BITS = 8, 1e12
MAX_HOSTS = 200
RATE_RE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]+)\s*")


class LabError(RuntimeError):
    """The lab cannot start or an operation on it failed; the message says what to do."""


def parse_rate(rate: str) -> float:
    """Return a tc rate such as "1gbit", "100mbit" or "12mbps" in bits per second; raise LabError naming the value
    and what is allowed for anything else."""
    allowed = f"a number and a unit of {sorted(UNITS)} from '8bit' to '1000gbit', e.g. rate='1gbit'"
    if not isinstance(rate, str):
        raise LabError(f"rate={rate!r} ({type(rate).__name__}): give a string, {allowed}")
    m = RATE_RE.fullmatch(rate.lower())
    if not m or m.group(2) not in UNITS:
        raise LabError(f"rate={rate!r}: give {allowed}")
    bits = float(m.group(1)) * UNITS[m.group(2)]
    if not MIN_BITS <= bits <= MAX_BITS:
        raise LabError(f"rate={rate!r} is {bits:g} bit/s, outside what tc's token bucket takes here: give {allowed}")
    return bits


def check_host_count(hosts) -> int:
    """Return `hosts` if it is a number of lab hosts (an int, not a bool, 1 to MAX_HOSTS); else raise LabError."""
    if isinstance(hosts, bool) or not isinstance(hosts, int) or not 1 <= hosts <= MAX_HOSTS:
        raise LabError(f"hosts={hosts!r}: give the number of hosts, an int from 1 to {MAX_HOSTS} (e.g. hosts=4; "
                       f"the lab names them h1..hN)")
    return hosts


def check_seconds(name: str, value, high: float = 24 * 3600, zero: bool = False) -> float:
    """Return `value` if it is a finite number of seconds above 0 (or 0 itself, with `zero`) and at most `high`;
    else raise LabError naming the argument, the value and the range."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not (0 <= value if zero else 0 < value) or value > high:
        raise LabError(f"{name}={value!r}: give a finite number of seconds, {'0' if zero else 'more than 0'} "
                       f"to {high:g}")
    return float(value)


def run(*cmd: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    """Run one system command (ip, tc, ...); raise LabError with its stderr when it fails."""
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode:
        raise LabError(f"`{' '.join(cmd)}` failed ({p.returncode}): {p.stderr.strip()}")
    return p


def _has_net_admin() -> bool:
    """Return whether this process holds CAP_NET_ADMIN (root in Docker without --cap-add NET_ADMIN does not)."""
    eff = next(line for line in open("/proc/self/status") if line.startswith("CapEff:"))
    return bool(int(eff.split()[1], 16) >> 12 & 1)
