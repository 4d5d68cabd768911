"""Measure a lab link's rate: a TCP socket stream from one emulated host to another, counted by the receiver."""
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
    recv = subprocess.Popen(lab.exec_cmd(dst, sys.executable, "-c", _PROBE, "recv", lab.addr_of(dst)),
                            stdout=subprocess.PIPE, text=True)
    try:
        port = recv.stdout.readline().strip()
        if not port:
            raise netlab.LabError(f"the rate probe on {dst} did not start")
        netlab.run(*lab.exec_cmd(src, sys.executable, "-c", _PROBE, "send", lab.addr_of(dst), port, str(seconds)),
                   timeout=seconds + 60)
        out, _ = recv.communicate(timeout=60)
        return json.loads(out)["bytes_per_s"]
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait()
