"""The lab's floor: errors, rates and the system commands (ip, tc) every part of kit.netlab runs."""
from __future__ import annotations

import re
import subprocess

UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9}


class LabError(RuntimeError):
    """The lab cannot start or an operation on it failed; the message says what to do."""


def parse_rate(rate: str) -> float:
    """Return a tc rate such as "1gbit", "100mbit" or "12mbps" in bits per second."""
    m = re.fullmatch(r"\s*([\d.]+)\s*([a-z]+)\s*", str(rate).lower())
    if not m or m.group(2) not in UNITS or float(m.group(1)) <= 0:
        raise LabError(f"rate {rate!r}: write a positive number and a unit of {sorted(UNITS)}, e.g. '1gbit'")
    return float(m.group(1)) * UNITS[m.group(2)]


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
