"""The byte counters of a lab host's NIC: what its link really carried, headers included.

    c0 = counters(); ...; c1 = counters()      # {"tx": bytes sent, "rx": bytes received} since the NIC came up
    payload(c1["tx"] - c0["tx"], c1["tx_packets"] - c0["tx_packets"])   # those bytes less each packet's headers

Read inside a host's namespace (an engine or server running on that host); `kit.netlab.exchange` and notebook
05's lab run count the bytes around their timed calls with it.
"""
from __future__ import annotations


HEADER_BYTES = 14 + 20 + 32
"""The headers of one TCP packet on a lab link: Ethernet 14, IPv4 20, TCP 20 with the 12-byte timestamp option Linux
sends by default. The veth NIC counts a segmentation-offloaded packet (up to 64 KB of payload) as one packet with
one set of headers, so the headers' share of the bytes swings with how the kernel batched the sends: a busy machine
sends smaller packets, each with its own headers, and pure ACKs (all header) for what the host received."""

MSS = 1500 - 20 - 32
"""The most payload one TCP segment carries on a lab link (MTU 1500 less IPv4 and TCP headers): the most a
retransmitted segment can add to a NIC's bytes."""


def counters(iface: str = "eth0") -> dict:
    """Return the bytes and packets this host's NIC has sent and received so far (its link's counters, headers
    included), and the TCP segments it retransmitted: {"tx", "rx", "tx_packets", "rx_packets", "retrans"}."""
    base = f"/sys/class/net/{iface}/statistics/"
    out = {}
    for key, name in (("tx", "tx_bytes"), ("rx", "rx_bytes"), ("tx_packets", "tx_packets"),
                      ("rx_packets", "rx_packets")):
        with open(f"{base}{name}") as f:
            out[key] = int(f.read())
    out["retrans"] = retransmitted()
    return out


def retransmitted() -> int:
    """Return the TCP segments this host (its network namespace) has retransmitted so far (RetransSegs)."""
    with open("/proc/net/snmp") as f:
        names, values = [line.split()[1:] for line in f if line.startswith("Tcp:")]
    return int(values[names.index("RetransSegs")])


def payload(nbytes: float, packets: float) -> float:
    """Return the bytes a NIC carried less the TCP/IP/Ethernet headers of its packets (HEADER_BYTES each)."""
    return nbytes - HEADER_BYTES * packets


def within(sent: float, model: float, resent: float, tol: float) -> bool:
    """A NIC's payload `sent` within `tol` (relative) of `model`, allowing one MSS more for each of the `resent`
    segments TCP sent again (their payload crossed the NIC twice)."""
    return -tol <= sent / model - 1 and (sent - MSS * resent) / model - 1 <= tol
