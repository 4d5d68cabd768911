"""The byte counters of a lab host's NIC: what its link really carried, headers included.

    c0 = counters(); ...; c1 = counters()      # {"tx": bytes sent, "rx": bytes received} since the NIC came up

Read inside a host's namespace (an engine or server running on that host); `kit.netlab.exchange` and notebook
05's lab run count the bytes around their timed calls with it.
"""
from __future__ import annotations


def counters(iface: str = "eth0") -> dict:
    """Return the bytes this host's NIC has sent and received so far (its link's counters, headers included)."""
    base = f"/sys/class/net/{iface}/statistics/"
    out = {}
    for key in ("tx", "rx"):
        with open(f"{base}{key}_bytes") as f:
            out[key] = int(f.read())
    return out
