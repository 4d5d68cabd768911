"""Measure a lab link with bare TCP sockets between two emulated hosts: its rate (a stream, counted by the
receiver) and its latency (4-byte messages bounced back and forth), without Gloo, engines or Python threads."""
from __future__ import annotations

import json
import subprocess
import sys

from kit.netlab import system as netlab

# A socket stream: the receiver counts the bytes after a 0.5 s warm-up (TCP slow start, the bucket's burst).
_PROBE = r"""
import json, socket, sys, time
if sys.argv[1] == "recv":
    s = socket.create_server((sys.argv[2], 0)); s.settimeout(60)
    print(s.getsockname()[1], flush=True)
    c, _ = s.accept(); c.settimeout(60); buf = bytearray(1 << 20); n = 0; t0 = None; start = time.perf_counter()
    while (k := c.recv_into(buf)):
        now = time.perf_counter()
        if t0 is None and now - start > 0.5: t0, n = now, 0
        n += k; end = now
    print(json.dumps({"bytes_per_s": n / (end - t0)}))
else:
    c = socket.create_connection((sys.argv[2], int(sys.argv[3])), timeout=60); data = bytes(1 << 20)
    stop = time.perf_counter() + float(sys.argv[4])
    while time.perf_counter() < stop: c.sendall(data)
    c.close()
"""


def stream(lab, src: str, dst: str, seconds: float) -> float:
    """Return the bytes/s that `dst` receives from a TCP stream sent by `src` for `seconds` (after a warm-up)."""
    _, received = _pair(lab, src, dst, _PROBE, "rate", ("recv", "send"), str(seconds), timeout=seconds + 60)
    return json.loads(received)["bytes_per_s"]


def _pair(lab, src: str, dst: str, probe: str, name: str, roles: tuple[str, str], *args: str,
          timeout: float) -> tuple[str, str]:
    """Start `probe` in its listening role on `dst` (it prints its port), run it in its other role on `src` against
    that port; return (what `src` printed, what `dst` printed once it ended). The listener never outlives the call."""
    srv = subprocess.Popen(lab.exec_cmd(dst, sys.executable, "-c", probe, roles[0], lab.addr_of(dst)),
                           stdout=subprocess.PIPE, text=True)
    try:
        port = srv.stdout.readline().strip()
        if not port:
            raise netlab.LabError(f"the {name} probe on {dst} did not start")
        client = netlab.run(*lab.exec_cmd(src, sys.executable, "-c", probe, roles[1], lab.addr_of(dst), port, *args),
                            timeout=timeout)
        out, _ = srv.communicate(timeout=60)
        return client.stdout, out
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()


# A 4-byte echo with TCP_NODELAY: one process on each host, a blocking recv and send each way, nothing else.
_ECHO = r"""
import json, socket, sys, time
if sys.argv[1] == "serve":
    s = socket.create_server((sys.argv[2], 0)); s.settimeout(60)
    print(s.getsockname()[1], flush=True)
    c, _ = s.accept(); c.settimeout(60); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while (m := c.recv(4)):
        c.sendall(m)
else:
    c = socket.create_connection((sys.argv[2], int(sys.argv[3])), timeout=60)
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1); out = []
    for _ in range(int(sys.argv[4]) + 2):
        t0 = time.perf_counter(); c.sendall(b"ping"); got = 0
        while got < 4:
            k = len(c.recv(4 - got))
            if not k:
                sys.exit("the echo server closed the connection")
            got += k
        out.append((time.perf_counter() - t0) / 2)
    c.close(); print(json.dumps(out[2:]))
"""


def echo(lab, src: str, dst: str, repeats: int) -> list[float]:
    """Return the one-way seconds of `repeats` 4-byte messages bounced between a bare socket on `src` and one on
    `dst` (after 2 warm-up rounds): the link's own latency, with the kernel's, and nothing of Gloo's."""
    sent, _ = _pair(lab, src, dst, _ECHO, "echo", ("serve", "ping"), str(repeats), timeout=60)
    return json.loads(sent)
