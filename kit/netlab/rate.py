"""Measure a lab link with bare TCP sockets between two emulated hosts: its rate (a stream, counted by the
receiver) and its latency (4-byte messages bounced back and forth), without Gloo, engines or Python threads."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from kit.netlab import system as netlab

PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "socket_probe.py")   # stdlib only


def stream(lab, src: str, dst: str, seconds: float) -> float:
    """Return the bytes/s that `dst` receives from a TCP stream sent by `src` for `seconds` (after a warm-up)."""
    _, received = _pair(lab, src, dst, "rate", ("recv", "send"), str(seconds), timeout=seconds + 60)
    return json.loads(received)["bytes_per_s"]


def _pair(lab, src: str, dst: str, name: str, roles: tuple[str, str], *args: str,
          timeout: float) -> tuple[str, str]:
    """Start the socket probe in its listening role on `dst` (it prints its port), run it in its other role on `src`
    against that port; return (what `src` printed, what `dst` printed once it ended). The listener never outlives
    the call."""
    srv = subprocess.Popen(lab.exec_cmd(dst, sys.executable, PROBE, roles[0], lab.addr_of(dst)),
                           stdout=subprocess.PIPE, text=True)
    try:
        port = srv.stdout.readline().strip()
        if not port:
            raise netlab.LabError(f"the {name} probe on {dst} did not start")
        client = netlab.run(*lab.exec_cmd(src, sys.executable, PROBE, roles[1], lab.addr_of(dst), port, *args),
                            timeout=timeout)
        out, _ = srv.communicate(timeout=60)
        return client.stdout, out
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()


def echo(lab, src: str, dst: str, repeats: int) -> list[float]:
    """Return the one-way seconds of `repeats` 4-byte messages bounced between a bare socket on `src` and one on
    `dst` (after 2 warm-up rounds): the link's own latency, with the kernel's, and nothing of Gloo's."""
    sent, _ = _pair(lab, src, dst, "echo", ("serve", "ping"), str(repeats), timeout=60)
    return json.loads(sent)
