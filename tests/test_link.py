"""kit.comm.link: one counted point-to-point link with a deadline, and one error type for a lost peer."""
import time

import pytest
import torch.distributed as dist

from kit.comm.link import Link, PeerLostError


class Done:
    """A message that has arrived: wait() returns at once and records the deadline it was given."""
    def __init__(self):
        self.given = None

    def wait(self, timeout):
        self.given = timeout.total_seconds()
        return True


class Closed:
    """A message whose peer closed the connection: wait() fails at once."""
    def wait(self, timeout):
        raise RuntimeError("Connection closed by peer")


class Silent:
    """A message that never comes: wait() gives up when its timeout passes, as gloo does."""
    def wait(self, timeout):
        time.sleep(timeout.total_seconds())
        raise RuntimeError("Timed out waiting")


def test_wait_returns_when_every_message_arrived_and_shares_one_deadline():
    link = Link("rank 0", timeout=5)
    works = [Done(), Done()]
    link.wait(works, ["rank 1", "rank 2"])
    assert all(0 < w.given <= 5 for w in works) and works[1].given <= works[0].given


def test_a_closed_connection_names_the_peer_at_once():
    link = Link("server 0 (rank 0)", timeout=30)
    t0 = time.monotonic()
    with pytest.raises(PeerLostError, match=r"^server 0 \(rank 0\): rank 2 closed the connection") as err:
        link.wait([Done(), Closed()], ["rank 1", "rank 2"])
    assert time.monotonic() - t0 < 30                                  # not at the deadline
    assert isinstance(err.value.__cause__, RuntimeError)               # the backend's own error is kept


def test_a_silent_peer_raises_by_the_deadline():
    link = Link("rank 0", timeout=0.2)
    with pytest.raises(PeerLostError, match=r"rank 1 sent nothing for 0.2 s"):
        link.wait([Silent()], "rank 1")


def test_one_name_for_every_work():
    with pytest.raises(PeerLostError, match="the servers closed"):
        Link("w", timeout=1).wait([Done(), Closed()], "the servers")


def test_bytes_messages_and_peers_are_counted(monkeypatch):
    import torch
    monkeypatch.setattr(dist, "isend", lambda tensor, dst: Done())
    monkeypatch.setattr(dist, "irecv", lambda tensor, src: Done())
    link = Link("rank 0", timeout=1)
    link.wait([link.isend(torch.zeros(10), 1), link.isend(torch.zeros(3, dtype=torch.float64), 2)], "peers")
    link.end_step()
    link.wait([link.irecv(torch.zeros(5), 1)], "rank 1")
    link.end_step()
    assert (link.sent, link.received, link.messages, link.peers) == (64, 20, 2, {1, 2})
    assert link.log == [(64, 0), (0, 20)]


def test_default_timeout_is_the_clusters(monkeypatch):
    monkeypatch.setenv("KIT_TIMEOUT", "7")
    assert Link("rank 0").timeout == 7
    assert Link("rank 0", timeout=3).timeout == 3
