"""python -m kit.bench ps: notebook 02's parameter-server measurements (`kit.comm.ps_measure`) at the benchmark's
settings: results/ps.json, ps*.png and the summary line.
"""
from __future__ import annotations

from kit import checks, env
from kit.comm import lessons
from kit.comm.costmodel import DEFAULT_SIZES, measure_alpha_beta
from kit.comm.ps import Config
from kit.comm.ps_measure import exchange, exchange_table, latency_table, summarise, training_runs


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
        lat = latency_table(c, runs=s["runs"])      # how one server pays N messages at once: alpha and o
    train_rows = [summarise(r, ab["alpha"], ab["B"], empty[nk], ab["B_max"][nk[1]]) for nk, r in runs.items()]
    return {"ab": ab, "train_rows": train_rows, "rows": rows, "engines": s["engines"], "latency": lat}


def bench(out_dir, quick: bool = False, tiny: bool = False):
    """Measure PS bytes, times and the alpha-beta model on 5 engines; write ps*.png; return (result, summary)."""
    from kit import plots
    x = experiment("tiny" if tiny else "quick" if quick else "full")
    ab, train_rows, model_rows, engines = x["ab"], x["train_rows"], x["rows"], x["engines"]
    cores = env.cpu_cores()
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
    result = {"alpha_s": ab["alpha"], "B_bytes_per_s": ab["B"], "pingpong": ab, "training": train_rows,
              "exchange": model_rows, "bytes_exact": exact, "within_25pct": [within, len(errors)],
              "within_25pct_without_t_empty": [sum(e <= 0.25 for e in plain), len(plain)], "latency": x["latency"]}
    return result, summary(result)


def summary(x: dict) -> str:
    """Return the benchmark's summary line of a run (results/ps.json): α, B, B_max, o, then its checks."""
    ab, rows = x["pingpong"], x["exchange"]
    errors = [abs(r["error"]) for r in rows]
    plain = [abs(r["measured_ms"] / r["predicted_one_host_ms"] - 1) for r in rows]
    cs = [lessons.equal_check("server bytes/step = N·K/k (every run)",
                              {f"N={r['N']} k={r['k']} K={r['K']}": r["bytes_exact"] for r in x["training"] + rows}),
          lessons.equal_check("exchanges within 25% of t_empty + 2NK/min(B_max, NB)",
                              {f"N={r['N']} k={r['k']} K={r['K']}": e <= 0.25 for r, e in zip(rows, errors)}),
          lessons.refined_check(sum(e < p for e, p in zip(errors, plain)), len(errors))]
    b_max = " / ".join(f"{b / 1e9:.2f}" for b in ab["B_max"].values())
    return (f"ps: alpha={ab['alpha'] * 1e6:.0f} us B={ab['B'] / 1e9:.2f} GB/s B_max={b_max} GB/s "
            f"o={(x['latency']['o'] or 0) * 1e6:.0f} us; checks {checks.summary_line(cs)}")
