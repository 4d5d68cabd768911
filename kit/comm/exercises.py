"""Checks of notebooks 02's and 03's exercises, written once for each notebook and its solutions: the check
computes the right answer here, so no visible cell of the notebook holds it.

    check_server_bytes(each, total, rows, K)                    # notebook 02, exercise 1
    check_n_star(n, alpha, B, K, compute_s, o)                  # notebook 02, exercise 2
    check_k_star(k, alpha, B, K, compute_s, o, n=64)            # notebook 02, exercise 3
    check_async_staleness(fn, run, slow)                        # notebook 02, exercise 4
    check_colocated(fn, cluster)                                # notebook 02, exercise 5 (on the engines)
    check_ring_bytes(answer, N=5, K=10 * 2**20, worker=2)       # notebook 03, exercise 1
    check_ring_steps(steps, chunk, n=8, worker=3)               # notebook 03, exercise 2
    check_ring_vs_ps(gap, k_star, ps_wins, alpha, o, B, N=64)   # notebook 03, exercise 3
    check_left_ring(ring_fn, cluster)                           # notebook 03, exercise 4 (on the engines)
    grade_ring(cluster, reduce_scatter, allgather, wait=20)     # notebook 03, exercise 5 (on the engines)
"""
from __future__ import annotations

import inspect

import numpy as np

from kit.comm import ring_sim
from kit.comm.costmodel import crossover_bytes, t_comm_ps, t_comm_ring

GRID = np.array([0, 4, 1 << 10, 4 << 10, 64 << 10, 1 << 20, 64 << 20, 1 << 30], dtype=float)
OPEN = "exercise {}: not answered yet"


def _say(n: int, parts: dict[str, bool], hint: str = "") -> str:
    """Return exercise n's verdict from its parts ({part: right?}): correct, or which parts are wrong (one part:
    "wrong", with `hint`), never the answer."""
    if all(parts.values()):
        return f"exercise {n}: correct"
    if len(parts) == 1:
        return f"exercise {n}: wrong" + (f" ({hint})" if hint else "")
    return f"exercise {n}: " + ", ".join(f"{k} {'right' if ok else 'wrong'}" for k, ok in parts.items())


def check_ring_bytes(answer, N: int = 5, K: int = 10 * 2**20, worker: int = 2) -> str:
    """Notebook 03, exercise 1: the bytes `worker` sends in one ring allreduce of K bytes over N workers, counted
    from the schedule itself (float32 chunks, ring_sim)."""
    if answer is None:
        return OPEN.format(1)
    bounds = ring_sim.chunk_bounds(K // 4, N)
    sent = sum(4 * (bounds[c][1] - bounds[c][0]) for phase in ("scatter_reduce", "allgather")
               for c in (ring_sim.send_chunk(worker, s, N, phase) for s in range(N - 1)))
    return _say(1, {"bytes": answer == sent}, "count its chunks, and their size")


def check_ring_steps(steps, chunk, n: int = 8, worker: int = 3) -> str:
    """Notebook 03, exercise 2: the ring's steps for n workers, and the chunk `worker` owns after scatter-reduce,
    read from a simulation."""
    if steps is None or chunk is None:
        return OPEN.format(2)
    _, st = ring_sim.simulate([np.ones(2 * n) * r for r in range(n)])
    return _say(2, {"steps": steps == len(st) - 1,
                    "chunk": chunk == int(np.flatnonzero(st[n - 1].contributions[worker] == n)[0])})


def _left_ring_run(fn):
    """On every engine: `fn` on this rank's seeded input; return (the sum right?, sent only to the left?) or the
    error. Equal chunks, so a wrong index gives a wrong sum, never a hang."""
    import numpy as np
    import torch.distributed as dist
    rank, n = dist.get_rank(), dist.get_world_size()
    inputs = [np.random.default_rng([4, r]).standard_normal(1000 * n) for r in range(n)]
    sent_to, isend = set(), dist.isend
    dist.isend = lambda tensor, dst, *a, **kw: sent_to.add(dst) or isend(tensor, dst, *a, **kw)
    try:
        out = fn(inputs[rank])
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    finally:
        dist.isend = isend
    return bool(np.allclose(out, np.sum(inputs, axis=0))), sent_to == {(rank - 1) % n}


def check_left_ring(ring_fn, cluster) -> str:
    """Notebook 03, exercise 4: `ring_fn(x)`, the ring sending to the left neighbour, run on the cluster's engines;
    right when every rank ends with the sum and sent only to its left neighbour."""
    if "..." in inspect.getsource(ring_fn):
        return OPEN.format(4)
    got = cluster.view.apply_sync(_left_ring_run, ring_fn)
    if any(isinstance(g, str) for g in got):
        return "exercise 4: it raised on the engines: " + next(g for g in got if isinstance(g, str))
    wrong = [r for r, (right_sum, _) in enumerate(got) if not right_sum]
    not_left = [r for r, (_, only_left) in enumerate(got) if not only_left]
    return ("exercise 4: correct" if not wrong and not not_left else
            f"exercise 4: wrong sum on ranks {wrong}" if wrong else
            f"exercise 4: ranks {not_left} sent to someone other than their left neighbour")


def check_ring_vs_ps(gap, k_star, ps_wins, alpha: float, o: float, B: float, N: int = 64,
                     alpha_ring: float | None = None) -> str:
    """Notebook 03, exercise 3: t_ps - t_ring as a function of K (one server paying 2(alpha + (N-1) o) + 2NK/B,
    the ring 2(N-1)(a_r + K/(NB)), a_r = `alpha_ring`, what each of the ring's messages in sequence paid on the
    lab, or alpha), the K below which the server is faster (within 1%; 0 if never), and whether it is faster at
    some K. Say which parts are right, never the answer."""
    if gap is None or k_star is None or ps_wins is None:
        return OPEN.format(3)
    a_r = alpha if alpha_ring is None else alpha_ring
    diff = t_comm_ps(N, GRID, alpha, B, o=o) - t_comm_ring(N, GRID, a_r, B)
    try:
        right_gap = bool(np.allclose(np.asarray(gap(GRID), dtype=float), diff, rtol=1e-9, atol=1e-15))
    except Exception as e:            # a lambda that fails on arrays is a wrong answer, said plainly
        return f"exercise 3: your gap raised {type(e).__name__}: {e} (it takes a numpy array of K)"
    want = float(crossover_bytes(N, alpha, B, o, alpha_ring=a_r))
    right_k = abs(float(k_star) - want) <= 0.01 * want if want > 0 else float(k_star) == 0
    return _say(3, {"t_ps - t_ring": right_gap, "the crossover K": right_k,
                    "'the server wins at some K'": bool(ps_wins) == bool(want > 0)})


def check_server_bytes(each, total, rows, K) -> str:
    """Notebook 02, exercise 1: `each(N, K, k)` the bytes ONE server receives per step, `total(N, K, k)` all of them
    together, against the counted `rows` (kit.comm.ps_measure.summarise)."""
    if each is None or total is None:
        return OPEN.format(1)
    right_each = all(abs(b - each(r["N"], K, r["k"])) <= 4 * r["N"]      # shards differ by at most one float
                     for r in rows for b in r["servers_in"])
    right_total = all(sum(r["servers_in"]) == total(r["N"], K, r["k"]) for r in rows)
    return _say(1, {"each server": right_each, "all servers": right_total})


def check_n_star(n, alpha: float, B: float, K: float, compute_s: float, o: float) -> str:
    """Notebook 02, exercise 2: the smallest N for which one server's communication exceeds `compute_s`."""
    if n is None:
        return OPEN.format(2)
    t = lambda n: t_comm_ps(n, K, alpha, B, 1, o)   # noqa: E731
    return _say(2, {"N": n >= 1 and t(n) > compute_s >= t(n - 1)})


def check_k_star(k, alpha: float, B: float, K: float, compute_s: float, o: float, n: int = 64) -> str:
    """Notebook 02, exercise 3: the fewest servers that keep n workers' communication at or below `compute_s`."""
    if k is None:
        return OPEN.format(3)
    t = lambda k: t_comm_ps(n, K, alpha, B, k, o)   # noqa: E731
    fits = k >= 1 and t(k) <= compute_s
    fewest = k == 1 or (k > 1 and t(k - 1) > compute_s)
    return _say(3, {"k": fits and fewest}, "too few" if not fits else "more than needed")


def staleness_while_all_push(run, slow: int) -> list[float]:
    """Each worker's mean staleness over the updates the asynchronous server applied up to the last one from a
    worker other than `slow` (while every worker was still pushing); nan for a worker with none."""
    s, who = np.asarray(run.servers[0]["staleness"], float), np.asarray(run.servers[0]["from"])
    last = int(np.flatnonzero(who != slow).max())
    s, who = s[:last + 1], who[:last + 1]
    return [float(s[who == w].mean()) if (who == w).any() else float("nan") for w in range(run.config.workers)]


def check_async_staleness(fn, run, slow: int) -> str:
    """Notebook 02, exercise 4: `fn(run, slow)`, each worker's mean staleness while every worker was still
    pushing, against the run's records (within 1e-9). Says right or wrong, never the numbers."""
    if fn is None:
        return OPEN.format(4)
    want = staleness_while_all_push(run, slow)
    try:
        got = [float(v) for v in fn(run, slow)]
    except Exception as e:            # the learner's code: say what it raised
        return f"exercise 4: your function raised {type(e).__name__}: {e}"
    if len(got) != len(want):
        return f"exercise 4: wrong: {len(got)} values for {len(want)} workers"
    return _say(4, {"means": np.allclose(got, want, rtol=1e-9, atol=1e-12, equal_nan=True)},
                "one value per worker, in rank order")


def _colocated_run(fn):
    """On every engine: `fn` on this rank's seeded gradient; return (equal to the mean?, bytes isend sent) or the
    error. A message nobody sends ends in the group's timeout, not a hang."""
    import numpy as np
    import torch
    import torch.distributed as dist
    rank, n = dist.get_rank(), dist.get_world_size()
    inputs = [torch.from_numpy(np.random.default_rng([5, r]).standard_normal(1001).astype(np.float32))
              for r in range(n)]
    sent, isend = [0], dist.isend

    def counting(tensor, dst, *a, **kw):
        sent[0] += tensor.numel() * tensor.element_size()
        return isend(tensor, dst, *a, **kw)
    dist.isend = counting
    try:
        out = fn(inputs[rank].clone())
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    finally:
        dist.isend = isend
    return bool(torch.allclose(out, torch.stack(inputs).mean(0), atol=1e-6)), sent[0]


def check_colocated(fn, cluster) -> str:
    """Notebook 02, exercise 5: `fn(grad)` averages every rank's gradient with rank r the server of shard r, run on
    the cluster's engines; right when the average is and each rank sends the ring's 2(N-1)/N·K bytes."""
    if "..." in inspect.getsource(fn):
        return OPEN.format(5)
    got = cluster.view.apply_sync(_colocated_run, fn)
    if any(isinstance(g, str) for g in got):
        return "exercise 5: it raised on the engines: " + next(g for g in got if isinstance(g, str))
    n, k_bytes = len(got), 1001 * 4
    wrong = [r for r, (right, _) in enumerate(got) if not right]
    ring = 2 * (n - 1) / n * k_bytes                          # notebook 03's ring, per rank
    bytes_like_ring = all(abs(b - ring) <= 2 * (n - 1) * 4 for _, b in got)   # up to one float per shard
    if wrong:
        return f"exercise 5: wrong average on ranks {wrong}"
    if not bytes_like_ring:
        return "exercise 5: the average is right, but the bytes sent are not 2(N-1)/N·K: " + str([b for _, b in got])
    return ("exercise 5: correct, and each rank sent " + ", ".join(str(b) for _, b in got) +
            f" bytes: the ring's 2(N-1)/N·K = {ring:.0f}")


from kit.comm.ring_exercise import grade_ring, judge_hang, judge_ring_phase  # noqa: E402,F401  (notebook 03, exercise 5)
