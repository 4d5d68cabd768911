"""Notebook 03's exercise 5, graded on the engines: the learner's two phases of the ring (reduce-scatter, then
allgather) over point-to-point messages. Each phase runs on its own with a bounded wait; a phase that hangs is
named (where each rank waits) and the engines' group is restarted so the notebook carries on.

    grade_ring(cluster, reduce_scatter, allgather, wait=20)     # also kit.comm.exercises.grade_ring
"""
from __future__ import annotations

OPEN = "exercise {}: not answered yet"
PHASES = ("reduce-scatter", "allgather")
P2P = ("send", "recv", "isend", "irecv")
COLLECTIVES = ("all_reduce", "reduce_scatter", "reduce_scatter_tensor", "all_gather", "all_gather_into_tensor",
               "broadcast", "reduce", "gather", "scatter")


class _Watched:
    """A request from isend/irecv whose wait() is noted in the log file first (where a rank blocks)."""

    def __init__(self, work, note, what):
        self._work, self._note, self._what = work, note, what

    def wait(self, *a, **kw):
        self._note(f"waiting on {self._what}")
        out = self._work.wait(*a, **kw)
        self._note("")
        return out

    def __getattr__(self, name):
        return getattr(self._work, name)


def _ring_phase_run(fn, phase: str, log: str) -> dict:
    """On every engine: `fn` (one phase of the ring, in place) on this rank's seeded 1-D float64 tensor; for the
    allgather, a tensor as a right reduce-scatter leaves it (rank r's chunk (r+1) % N summed). Return which chunks
    hold the sum afterwards, whom the rank sent to and received from, the collectives it called, or its error.
    Each point-to-point call that can block first writes what it waits on to `log`/rank (read on a hang)."""
    import os
    import numpy as np
    import torch
    import torch.distributed as dist
    from kit.comm.ring_sim import chunk_bounds
    rank, n = dist.get_rank(), dist.get_world_size()
    inputs = [np.random.default_rng([6, r]).standard_normal(1000 * n + 1) for r in range(n)]   # awkward length
    total, bounds = np.sum(inputs, axis=0), chunk_bounds(1000 * n + 1, n)
    flat = torch.from_numpy(inputs[rank].copy())
    if phase == "allgather":
        a, b = bounds[(rank + 1) % n]
        flat[a:b] = torch.from_numpy(total[a:b])
    path = os.path.join(log, str(rank))

    def note(what):
        try:
            with open(path, "w") as f:
                f.write(what)
        except OSError:                   # an engine on another host: no log, the verdict says less
            pass
    sent, got, used, real = set(), set(), [], {k: getattr(dist, k) for k in P2P + COLLECTIVES if hasattr(dist, k)}

    def blocking(name, f):
        def call(tensor, peer=None, *a, **kw):
            peer = kw.pop("dst", kw.pop("src", peer))
            (sent if name == "send" else got).add(peer)
            note(f"dist.{name} {'to' if name == 'send' else 'from'} rank {peer}")
            out = f(tensor, peer, *a, **kw)
            note("")
            return out
        return call

    def posting(name, f):
        def call(tensor, peer=None, *a, **kw):
            peer = kw.pop("dst", kw.pop("src", peer))
            (sent if name == "isend" else got).add(peer)
            return _Watched(f(tensor, peer, *a, **kw), note, f"dist.{name} {'to' if name == 'isend' else 'from'} "
                                                             f"rank {peer}")
        return call
    for k, f in real.items():
        setattr(dist, k, blocking(k, f) if k in ("send", "recv") else posting(k, f) if k in P2P else
                (lambda k, f: lambda *a, **kw: (used.append(k), f(*a, **kw))[1])(k, f))
    try:
        fn(flat)
        report = {"sums": [bool(np.allclose(flat[a:b].numpy(), total[a:b], rtol=1e-9, atol=1e-12))
                           for a, b in bounds]}
    except NotImplementedError:
        report = {"unanswered": True}
    except Exception as e:                # the learner's code: say what it raised, on which rank
        report = {"error": f"{type(e).__name__}: {e}"}
    finally:
        for k, f in real.items():
            setattr(dist, k, f)
        note("")
    return {"rank": rank, "n": n, "sent": sorted(sent), "got": sorted(got), "used": used, **report}


def judge_ring_phase(phase: str, reports: list[dict]) -> str | None:
    """One phase's verdict from every rank's report (ordered by rank): None when it is right, else what is wrong
    (which rank, which chunk), never the values."""
    head = f"exercise 5, {phase}"
    if all(r.get("unanswered") for r in reports):
        return "unanswered"
    for r in reports:
        rank = r["rank"]
        if r.get("unanswered"):
            return f"{head}: rank {rank} still raises NotImplementedError: every rank runs the same code"
        if "error" in r:
            return f"{head}: rank {rank} raised {r['error']}"
        right, left = (rank + 1) % r["n"], (rank - 1) % r["n"]
        if r["used"]:
            return (f"{head}: rank {rank} called dist.{r['used'][0]}: the ring uses point-to-point messages only "
                    "(send/recv, isend/irecv)")
        if set(r["sent"]) - {right} or set(r["got"]) - {left}:
            return (f"{head}: rank {rank} sent to {r['sent']} and received from {r['got']}: only to its right "
                    f"neighbour (rank {right}) and from its left one (rank {left})")
    if phase == "reduce-scatter":
        for r in reports:
            own = (r["rank"] + 1) % r["n"]
            if not r["sums"][own]:
                return (f"{head}: wrong sum on rank {r['rank']} in chunk {own}, the chunk it owns after N−1 steps: "
                        "look at which chunk it sends and which one it adds in each step")
        return None
    missing = {r["rank"]: [c for c, ok in enumerate(r["sums"]) if not ok] for r in reports}
    if not any(missing.values()):
        return None
    if all(len(m) == r["n"] - 1 for r, m in zip(reports, missing.values())):
        return (f"{head}: the ranks disagree: each still holds only its own finished chunk, so no chunk was passed "
                "on (the allgather is missing)")
    rank, chunks = next((k, m) for k, m in missing.items() if m)
    return (f"{head}: the ranks disagree: rank {rank} lacks the sum in chunk(s) {chunks} (partial: a chunk passed "
            "on before it was finished, received into the wrong chunk, or fewer than N−1 steps)")


def judge_hang(phase: str, blocked: dict[int, str], seconds: float, n: int) -> str:
    """The verdict for a phase that did not finish in `seconds`: a deadlock, named from where each rank was
    waiting (`blocked`: rank -> the call it was in, "" if none was noted)."""
    head = f"exercise 5, {phase}: deadlock, no rank finished in {seconds:.0f} s"
    waits = [blocked.get(r, "") for r in range(n)]
    tail = "; the engines were restarted with a fresh process group"
    if all(w.startswith("dist.send ") for w in waits):
        return (f"{head}: every rank is blocked in dist.send, sending before it receives (a blocking send returns "
                f"only once its receiver has posted the receive, and no rank gets to its receive){tail}")
    seen = "; ".join(f"rank {r} in {w}" for r, w in enumerate(waits) if w)
    return (f"{head}: each rank waits for a message no other rank sends"
            + (f" ({seen})" if seen else "") + f"{tail}")


def grade_ring(cluster, reduce_scatter, allgather, wait: float = 20.0) -> str:
    """Notebook 03, exercise 5: the learner's `reduce_scatter(flat)` and `allgather(flat)` (in place, point-to-
    point only) run on the cluster's engines, each phase on its own with at most `wait` seconds for it: the
    allgather from a right reduce-scatter's result. A phase that hangs is named as a deadlock, and the engines
    are restarted (cluster.restart(), init_process_group()) so that the notebook carries on."""
    import shutil
    import tempfile
    from ipyparallel.error import TimeoutError as NoReply
    for phase, fn in zip(PHASES, (reduce_scatter, allgather)):
        log = tempfile.mkdtemp(prefix="kit-ring-")
        try:
            try:
                reports = cluster.wait(cluster.view.apply_async(_ring_phase_run, fn, phase, log), timeout=wait)
            except NoReply:
                blocked = {}
                for r in range(cluster.size):
                    try:
                        blocked[r] = open(f"{log}/{r}").read()
                    except OSError:
                        pass
                cluster.restart()
                cluster.init_process_group()
                return judge_hang(phase, blocked, wait, cluster.size)
        finally:
            shutil.rmtree(log, ignore_errors=True)
        verdict = judge_ring_phase(phase, sorted(reports, key=lambda r: r["rank"]))
        if verdict == "unanswered":
            return OPEN.format(5) if phase == "reduce-scatter" else "exercise 5: reduce-scatter right; allgather " \
                                                                   "not answered yet"
        if verdict:
            return verdict
    return f"exercise 5: correct: both phases, every rank holds the sum ({cluster.size} ranks)"
