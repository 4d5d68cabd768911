"""Measuring the parameter server on the engines (notebooks 02, 02a and `python -m kit.bench ps`), each once.

    runs = training_runs(cluster, cfg)                     # {(N, k): Run} for every N and k the cluster allows
    rows, empty = exchange_table(cluster, ab)              # bare exchanges of 4 and 16 MB, with the model's prediction
    summarise(run, alpha, B, t_empty, B_max)               # one table row: exact bytes, times, predictions
    lat = latency_table(cluster, ns=(1, 2, 3))             # empty steps against N: the PS's alpha and overhead o

Each takes the notebook's settings by default; `kit.bench.ps` passes the benchmark's.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from kit.comm.costmodel import fit_latency, t_comm_one_host, t_comm_ps
from kit.comm.ps import Config, Run, train


def summarise(run: Run, alpha: float | None = None, B: float | None = None, t_empty: float | None = None,
              B_max: float | None = None) -> dict:
    """Return one table row: N, k, K, exact bytes per step at each server and worker, times, the predictions.

    With alpha and B: `predicted_k_links_ms` is `t_comm_ps(N, K, alpha, B, k)`, 2 alpha + 2 max(N/k, 1) K/B
    (each server on its own link); `predicted_one_host_ms` the same with k = 1 (the k servers share this host's
    link). With t_empty (seconds, from `empty_exchange`) and B_max: `predicted_ms` = t_empty + 2 N K / min(B_max,
    N B) (`t_comm_one_host`), the model for one host; `error` = measured / predicted - 1."""
    cfg, sb, wb = run.config, run.server_bytes(), run.worker_bytes()
    one = lambda xs: xs[0] if len(set(xs)) == 1 else None  # noqa: E731  the same every step, or None
    t = run.times()
    row = {"N": cfg.workers, "k": cfg.servers, "mode": cfg.mode, "K": run.grad_bytes,
           "server_in": one(sb[0]["in"]), "server_out": one(sb[0]["out"]),
           "servers_in": [one(s["in"]) for s in sb], "servers_out": [one(s["out"]) for s in sb],
           "worker_in": one(wb[0]["in"]), "worker_out": one(wb[0]["out"]),
           "compute_ms": 1e3 * t["compute"], "comm_ms": 1e3 * t["comm"]}
    shard = [int(p.size) * 4 for p in (s["params"] for s in run.servers)]
    row["bytes_exact"] = all(one(s["in"]) == one(s["out"]) == cfg.workers * b for s, b in zip(sb, shard)) and \
        sum(shard) == run.grad_bytes and all(one(w["in"]) == one(w["out"]) == run.grad_bytes for w in wb)
    if cfg.mode == "sync":
        row["server_ms"] = 1e3 * (t["recv"] + t["send"])     # the server's own view (misses what overlapped)
        row["update_ms"] = 1e3 * t["update"]
        # A worker's push + pull, less the server's arithmetic: the time messages took, as the worker sees it.
        row["exchange_ms"] = row["comm_ms"] - row["update_ms"]
    row["measured_ms"] = row.get("exchange_ms", row["comm_ms"])
    if alpha is not None:
        N, K = cfg.workers, run.grad_bytes
        row["predicted_k_links_ms"] = 1e3 * float(t_comm_ps(N, K, alpha, B, cfg.servers))
        row["predicted_one_host_ms"] = 1e3 * float(t_comm_ps(N, K, alpha, B, 1))
        row["predicted_ms"] = row["predicted_one_host_ms"]
        if t_empty is not None:
            row["empty_ms"] = 1e3 * t_empty
            row["predicted_ms"] = 1e3 * float(t_comm_one_host(N, K, B, t_empty, B_max))
        row["error"] = row["measured_ms"] / row["predicted_ms"] - 1
    return row


def exchange(cluster, workers: int, servers: int, floats: int, steps: int = 30, runs: int = 1, **model) -> dict:
    """Time a pure exchange (no model, no compute) of `floats` float32 values per worker, `runs` times; return the
    summary row (`summarise(run, **model)`) of the median run (of two, the faster): the scheduler sometimes keeps
    two busy processes on one core for a whole run. floats=1 is the empty exchange: the per-step latency of this
    pattern here."""
    cfg = Config(workers=workers, servers=servers, steps=steps, exchange_only=floats)
    rows = sorted((summarise(train(cluster, cfg), **model) for _ in range(runs)), key=lambda r: r["measured_ms"])
    return rows[(runs - 1) // 2]


def empty_exchange(cluster, workers: int, servers: int, runs: int = 3, steps: int = 50) -> float:
    """Return the seconds of one empty exchange (one float) of this pattern, the median of `runs` runs."""
    return exchange(cluster, workers, servers, 1, steps, runs)["measured_ms"] / 1e3


def training_runs(cluster, cfg: Config, servers=(1, 2), algorithm: dict | None = None) -> dict:
    """Train `cfg` once for every k in `servers` and every N the cluster has room for (N + k engines), with
    `algorithm` (see `kit.comm.ps.train`) if given; return {(N, k): Run}."""
    return {(n, k): train(cluster, replace(cfg, workers=n, servers=k), algorithm=algorithm)
            for k in servers for n in range(1, cluster.size - k + 1)}


def exchange_table(cluster, ab: dict, floats=(1 << 20, 1 << 22), steps: int = 30, runs: int = 3,
                   servers=(1, 2), empty_runs: int = 3) -> tuple[list[dict], dict]:
    """Time bare exchanges of each size in `floats` (float32 values) for every N and k the cluster allows, with
    the one-host model built from `ab` (`measure_alpha_beta`) and each pattern's empty exchange; return (rows,
    {(N, k): t_empty seconds})."""
    rows, empty = [], {}
    for k in servers:
        for n in range(1, cluster.size - k + 1):
            empty[n, k] = empty_exchange(cluster, n, k, empty_runs)
            rows += [exchange(cluster, n, k, f, steps, runs, alpha=ab["alpha"], B=ab["B"], t_empty=empty[n, k],
                              B_max=ab["B_max"][k]) for f in floats]
    return rows, empty


def latency_table(cluster, ns=None, runs: int = 3, steps: int = 50) -> dict:
    """Time the empty exchange (one float) of one server with N workers for each N in `ns` (default: 1 .. engines
    - 1), `runs` times each; fit t(N) = 2 (alpha + (N-1) o); return {"ns", "seconds" (median), "range" (min-max),
    "alpha", "o"}: how this server pays N messages at once (o << alpha: overlapped; o ~ alpha: serial)."""
    ns = list(ns or range(1, cluster.size))
    per = {n: [exchange(cluster, n, 1, 1, steps)["measured_ms"] / 1e3 for _ in range(runs)] for n in ns}
    seconds = [float(np.median(per[n])) for n in ns]
    alpha, o = fit_latency(ns, seconds) if len(ns) >= 2 else (seconds[0] / 2, None)
    return {"ns": ns, "seconds": seconds, "range": [[min(per[n]), max(per[n])] for n in ns], "alpha": alpha, "o": o}
