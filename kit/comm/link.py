"""One counted point-to-point link: isend/irecv over torch.distributed that count bytes and never wait forever.

    link = Link("worker 0 (rank 1)", timeout=60)
    link.wait([link.isend(grad, dst=0), link.irecv(params, src=0)], "server 0 (rank 0)")
    link.sent, link.received, link.messages, link.peers, link.log

Both the parameter server (`kit.comm.ps`) and the ring (`kit.comm.ring`) talk through it; a peer that dies or stops
answering raises the one error type `PeerLostError`, naming that peer, by the deadline.
"""
from __future__ import annotations

import datetime
import os
import time


class PeerLostError(RuntimeError):
    """A message from (or to) another rank did not arrive in time: that rank died or stopped answering."""


def default_timeout() -> float:
    """Return the seconds a step may wait for its messages: the cluster's KIT_TIMEOUT (60 without one)."""
    return float(os.environ.get("KIT_TIMEOUT", 60))


class _Failed:
    """A send or receive that failed as it was posted (the peer's connection was already closed): its `wait`
    raises that error, so `Link.wait` names the peer as for any other failed message."""

    def __init__(self, error: Exception):
        self.error = error

    def wait(self, timeout=None):
        raise self.error


class Link:
    """This process's end of the messages: isend/irecv that count bytes and wait no longer than a deadline."""

    def __init__(self, me: str, timeout: float | None = None):
        self.me = me
        self.timeout = timeout or default_timeout()
        self.sent = self.received = self.messages = 0
        self.peers: set[int] = set()            # ranks this process sent to
        self.log: list[tuple[int, int]] = []    # (sent, received) bytes of each step, see end_step

    def isend(self, tensor, dst: int):
        """Start sending `tensor` to rank `dst`; count its bytes."""
        import torch.distributed as dist
        self.sent += tensor.numel() * tensor.element_size()
        self.messages += 1
        self.peers.add(dst)
        try:
            return dist.isend(tensor, dst)
        except (RuntimeError, ValueError) as e:   # gloo: "Connection closed by peer" when the peer is gone
            return _Failed(e)

    def irecv(self, tensor, src: int | None):
        """Start receiving into `tensor` from rank `src` (None: from any rank); count its bytes."""
        import torch.distributed as dist
        self.received += tensor.numel() * tensor.element_size()
        try:
            return dist.irecv(tensor, src)
        except (RuntimeError, ValueError) as e:
            return _Failed(e)

    def wait(self, works, peers):
        """Wait for every message (or collective) in `works`; `peers` names who each one waits on (one name for
        all, or one per work). Raise PeerLostError naming that peer if one fails or misses the deadline."""
        peers = [peers] * len(works) if isinstance(peers, str) else list(peers)
        deadline = time.monotonic() + self.timeout
        for work, peer in zip(works, peers):
            try:
                work.wait(timeout=datetime.timedelta(seconds=max(0.01, deadline - time.monotonic())))
            except (RuntimeError, ValueError) as e:   # gloo raises RuntimeError (DistBackendError is one)
                late = time.monotonic() >= deadline - 0.05
                why = f"sent nothing for {self.timeout:g} s (hung or dead)" if late else \
                    "closed the connection (it died, or gave up after an error)"
                raise PeerLostError(f"{self.me}: {peer} {why}") from e

    def end_step(self):
        """Record the bytes moved since the last call as one step of `log`."""
        done = sum(s for s, _ in self.log), sum(r for _, r in self.log)
        self.log.append((self.sent - done[0], self.received - done[1]))
