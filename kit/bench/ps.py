"""Measuring the parameter server (notebook 02 and `python -m kit.bench ps`), each experiment written once.

    runs = training_runs(cluster, cfg)                     # {(N, k): Run} for every N and k the cluster allows
    rows, empty = exchange_table(cluster, ab)              # bare exchanges of 4 and 16 MB, with the model's prediction
    summarise(run, alpha, B, t_empty, B_max)               # one table row: exact bytes, times, predictions

Each takes the notebook's settings by default; `bench` passes the benchmark's.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from kit import env
from kit.comm.costmodel import DEFAULT_SIZES, measure_alpha_beta, t_comm_one_host, t_comm_ps
from kit.comm.ps import Config, Run, train


def summarise(run: Run, alpha: float | None = None, B: float | None = None, t_empty: float | None = None,
              B_max: float | None = None) -> dict:
    """Return one table row: N, k, K, exact bytes per step at each server and worker, times, the predictions.

    With alpha and B: `predicted_k_links_ms` is 2 N (alpha + K / (k B)) (`t_comm_ps`: each server on its own
    link); `predicted_one_host_ms` is 2 N (alpha + K / B) (the k servers share this host). With t_empty (seconds, from
    `empty_exchange`) and B_max: `predicted_ms` = t_empty + 2 N K / min(B_max, N B) (`t_comm_one_host`), the
    model for one host; `error` = measured / predicted - 1."""
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


# ----------------------------------------------------------------------------- the benchmark
SETTINGS = {   # training steps, exchange sizes (float32 values), ping-pong repeats and rounds, exchange runs
    "tiny": dict(engines=3, steps=3, floats=(1 << 12,), pingpong=(2, 1), runs=1, sizes=[4, 1 << 16, 1 << 20],
                 servers=(1,)),
    "quick": dict(engines=5, steps=8, floats=(1 << 20,), pingpong=(3, 1), runs=3, sizes=DEFAULT_SIZES, servers=(1, 2)),
    "full": dict(engines=5, steps=40, floats=(1 << 20, 1 << 22), pingpong=(20, 3), runs=3, sizes=DEFAULT_SIZES,
                 servers=(1, 2)),
}


def experiment(size: str = "full") -> dict:
    """Run notebook 02's measurements at the benchmark's settings: ping-pong, training runs, exchanges."""
    from kit import cluster as kc
    s = SETTINGS[size]
    with kc.start(n=s["engines"], quiet=True) as c:
        c.init_process_group()
        exchange(c, c.size - 1, 1, s["floats"][-1], 5)   # warm-up: first big messages pay for buffers, page faults
        ab = measure_alpha_beta(c, s["sizes"], repeats=s["pingpong"][0], rounds=s["pingpong"][1])
        runs = training_runs(c, Config(steps=s["steps"], batch=120 if size != "tiny" else 12), s["servers"])
        rows, empty = exchange_table(c, ab, s["floats"], s["steps"], s["runs"], s["servers"], s["runs"])
    train_rows = [summarise(r, ab["alpha"], ab["B"], empty[nk], ab["B_max"][nk[1]]) for nk, r in runs.items()]
    return {"ab": ab, "train_rows": train_rows, "rows": rows, "engines": s["engines"]}


def bench(out_dir, quick: bool = False, tiny: bool = False):
    """Measure PS bytes, times and the alpha-beta model on 5 engines; write ps*.png; return (result, summary)."""
    from kit import plots
    x = experiment("tiny" if tiny else "quick" if quick else "full")
    ab, train_rows, model_rows, engines = x["ab"], x["train_rows"], x["rows"], x["engines"]
    K, cores = train_rows[0]["K"], env.cpu_cores()
    fig, (ax,) = plots.figure(2, figsize=(10, 3.6))
    plots.plot_ps_bytes(train_rows, ax=ax[0])
    plots.plot_ps_split(train_rows, f"MLP step time ({engines} engines on {cores} cores: oversubscribed)", ax=ax[1])
    fig.tight_layout(), fig.savefig(out_dir / "ps.png", dpi=100)
    fig, (ax,) = plots.figure(2, figsize=(10, 3.6))
    plots.plot_ps_model(ab, model_rows, ax=ax)
    fig.tight_layout(), fig.savefig(out_dir / "ps_model.png", dpi=100)
    fig, ax = plots.figure(figsize=(5.5, 3.8))
    plots.plot_ps_extrapolation(ab["alpha"], 25e9 / 8, 100e6, [8, 16, 32, 64, 128, 256, 512], ax=ax[0, 0])
    fig.tight_layout(), fig.savefig(out_dir / "ps_extrapolation.png", dpi=100)
    errors = [abs(r["error"]) for r in model_rows]
    plain = [abs(r["measured_ms"] / r["predicted_one_host_ms"] - 1) for r in model_rows]
    within = sum(e <= 0.25 for e in errors)
    exact = all(r["bytes_exact"] for r in train_rows + model_rows)
    big = max(model_rows, key=lambda r: (r["K"], r["N"], -r["k"]))
    B_max = " / ".join(f"{b / 1e9:.2f}" for b in ab["B_max"].values())
    summary = (f"ps: alpha={ab['alpha'] * 1e6:.0f} us B={ab['B'] / 1e9:.2f} GB/s B_max={B_max} GB/s "
               f"({' / '.join(map(str, ab['B_max']))} servers); server bytes/step == N*K/k exactly: {exact} "
               f"(MLP K={K} B); prediction t_empty + 2NK/min(B_max, NB) within 25% for {within}/{len(errors)} "
               f"exchanges (median |error| {np.median(errors):.0%}; the plain 2N(alpha + K/B): "
               f"{sum(e <= 0.25 for e in plain)}/{len(plain)}; N={big['N']} k={big['k']} K={big['K'] / 1e6:.1f} MB: "
               f"{big['measured_ms']:.0f} ms measured vs {big['predicted_ms']:.0f} predicted); {engines} engines on "
               f"{cores} cores (times oversubscribed)")
    result = {"alpha_s": ab["alpha"], "B_bytes_per_s": ab["B"], "pingpong": ab, "training": train_rows,
              "exchange": model_rows, "bytes_exact": exact, "within_25pct": [within, len(errors)],
              "within_25pct_without_t_empty": [sum(e <= 0.25 for e in plain), len(plain)]}
    return result, summary
