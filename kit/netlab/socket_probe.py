"""Bare TCP probes that kit.netlab.rate runs on a lab host, with nothing but the standard library:

    python socket_probe.py recv ADDR              # listen (print the port), count a stream's bytes after 0.5 s
    python socket_probe.py send ADDR PORT SECONDS # stream 1 MiB buffers to ADDR:PORT for SECONDS
    python socket_probe.py serve ADDR             # listen (print the port), echo 4-byte messages back
    python socket_probe.py ping ADDR PORT REPEATS # bounce 4 bytes REPEATS (+2 warm-up) times; print one-way seconds
"""
import json
import socket
import sys
import time


def listen(addr: str) -> socket.socket:
    """Return the one connection accepted on a fresh port of `addr` (the port printed first, for the other end)."""
    s = socket.create_server((addr, 0))
    s.settimeout(60)
    print(s.getsockname()[1], flush=True)
    c, _ = s.accept()
    c.settimeout(60)
    return c


def recv(addr: str) -> None:
    """Count the bytes of one stream after a 0.5 s warm-up (TCP slow start, the bucket's burst); print bytes/s."""
    c, buf, n, t0, start = listen(addr), bytearray(1 << 20), 0, None, time.perf_counter()
    while (k := c.recv_into(buf)):
        now = time.perf_counter()
        if t0 is None and now - start > 0.5:
            t0, n = now, 0
        n += k
        end = now
    print(json.dumps({"bytes_per_s": n / (end - t0)}))


def send(addr: str, port: str, seconds: str) -> None:
    """Send 1 MiB buffers to addr:port for `seconds`."""
    c, data, stop = socket.create_connection((addr, int(port)), timeout=60), bytes(1 << 20), time.perf_counter()
    stop += float(seconds)
    while time.perf_counter() < stop:
        c.sendall(data)
    c.close()


def serve(addr: str) -> None:
    """Echo every 4-byte message back (TCP_NODELAY), until the other end closes."""
    c = listen(addr)
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while (m := c.recv(4)):
        c.sendall(m)


def ping(addr: str, port: str, repeats: str) -> None:
    """Bounce 4 bytes off addr:port `repeats` times after 2 warm-up rounds; print each round's one-way seconds."""
    c, out = socket.create_connection((addr, int(port)), timeout=60), []
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for _ in range(int(repeats) + 2):
        t0, got = time.perf_counter(), 0
        c.sendall(b"ping")
        while got < 4:
            k = len(c.recv(4 - got))
            if not k:
                sys.exit("the echo server closed the connection")
            got += k
        out.append((time.perf_counter() - t0) / 2)
    c.close()
    print(json.dumps(out[2:]))


if __name__ == "__main__":
    {"recv": recv, "send": send, "serve": serve, "ping": ping}[sys.argv[1]](*sys.argv[2:])
