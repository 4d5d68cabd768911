"""python -m kit.bench ps: notebook 02's parameter-server measurements (`kit.comm.ps_measure`) at the benchmark's
settings: results/ps.json, ps*.png and the summary line.
"""
from __future__ import annotations

import numpy as np

from kit import env
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
               f"exchanges (median |error| {np.median(errors):.0%}; the plain 2 alpha + 2NK/B: "
               f"{sum(e <= 0.25 for e in plain)}/{len(plain)}; N={big['N']} k={big['k']} K={big['K'] / 1e6:.1f} MB: "
               f"{big['measured_ms']:.0f} ms measured vs {big['predicted_ms']:.0f} predicted); {engines} engines on "
               f"{cores} cores (times oversubscribed); empty step 2(alpha + (N-1) o): "
               f"alpha {x['latency']['alpha'] * 1e6:.0f} us, o {(x['latency']['o'] or 0) * 1e6:.0f} us")
    result = {"alpha_s": ab["alpha"], "B_bytes_per_s": ab["B"], "pingpong": ab, "training": train_rows,
              "exchange": model_rows, "bytes_exact": exact, "within_25pct": [within, len(errors)],
              "within_25pct_without_t_empty": [sum(e <= 0.25 for e in plain), len(plain)], "latency": x["latency"]}
    return result, summary
