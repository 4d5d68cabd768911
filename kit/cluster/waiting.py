"""Waiting on a cluster's engines: a result (`Cluster.wait`) and the engines that died (`Cluster.poll_dead`).

Both are the Cluster's methods; their bodies live here, with `self` the Cluster, to keep kit.cluster.core to the
life cycle.
"""
from __future__ import annotations

import math
import time

from kit.cluster import engines
from kit.cluster.checks import ArgumentError
from kit.cluster.guard import StallError


def wait(self, async_result, timeout: float | None = None):
    """Return an AsyncResult's value; if an engine died (or its host is cut off), raise RankDiedError naming it;
    if a rank never joined a collective the others wait in, StallError naming it (after `self.timeout`); if the
    controller died, ControllerDiedError."""
    from ipyparallel import AsyncResult
    from ipyparallel.error import EngineError, RemoteError   # RemoteError: also CompositeError (a view)
    self._usable()
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not math.isfinite(timeout) or timeout < 0):
        raise ArgumentError(f"cluster.wait: timeout={timeout!r} is not allowed: None (wait until it is done) "
                            "or a finite number of seconds >= 0")
    if not isinstance(async_result, AsyncResult) or async_result._client is not self._client:
        raise ArgumentError(f"cluster.wait: async_result={async_result!r:.60} is not allowed: an AsyncResult of "
                            "this cluster (what its view's apply_async or execute returns)")
    deadline = None if timeout is None else time.time() + timeout
    while not async_result.ready() and (deadline is None or time.time() < deadline):
        if self._controller is not None:
            raise self.refusal()
        # dead engines: noted as they exit (_watch_engines); behind a cut link: looked for once a part failed
        failed = any(isinstance(self._client.results.get(m), Exception) for m in async_result.msg_ids)
        lost = self.launcher.lost_now(self.slots, after=self.timeout / 2) if self.slots else {}
        if lost or self.dead or (failed and self.poll_dead()):
            raise self.died_error(lost)
        async_result.wait(1.0 if deadline is None else max(0.0, min(1.0, deadline - time.time())))
    try:
        return async_result.get(timeout=0 if deadline is not None else None)
    except (RemoteError, EngineError) as e:
        # ipyparallel may call an engine dead (missed heartbeats: one the OOM killer is reclaiming stalls) a
        # moment before its process is gone: give the process a few seconds to end before calling it alive.
        names = {type(e).__name__, getattr(e, "ename", "")} | {x[0] for x in getattr(e, "elist", []) if x}
        until = time.time() + (10 if "EngineError" in names else 0)
        while not self.poll_dead() and time.time() < until:
            time.sleep(0.2)
        if self.dead:
            raise self.died_error() from e
        if self.stall is not None:
            raise StallError(self.stall.message()) from e
        raise


def poll_dead(self) -> dict[int, str]:
    """Check every engine process now; return {rank: what happened} for those that died (first first)."""
    import psutil
    self._usable()
    for rank, pid in (self._pids or {}).items():
        if rank in self.dead:
            continue
        try:
            gone = psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.Error:
            gone = True
        if gone:
            self.dead[rank] = self._how_it_died(rank)
    if self.slots and self._state == "running" and len(self.dead) < self.n:
        for rank, why in self.launcher.lost_ranks(self.slots).items():
            self.dead.setdefault(rank, why)
    return self.dead


def how_it_died(self, rank: int) -> str:
    """Return what happened to rank `rank`'s engine: its engine id, pid, and how it ended (with its last words)."""
    pid = self._pids[rank]
    said = engines.last_output(self._outputs.get(pid, ""), since=self._marks.get(pid, 0))   # this task's words
    why = engines.how_it_died(pid, self._procs.get(pid, 0), output=said)
    return f"engine {next(e for e, s in self.slots.items() if s.rank == rank)} (pid {pid}) {why}"
