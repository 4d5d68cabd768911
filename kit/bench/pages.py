"""The blocks of each benchmark's page, rendered from its results/NAME.json: the kit's own renderer where the kit
has one (the notebooks show the same tables), else the columns the JSON records, formatted here. kit.bench.render
puts block i of BLOCKS[NAME](x) between `<!-- render NAME:i -->` and `<!-- /render -->` in docs/benchmarks/NAME.md."""
from __future__ import annotations


def loading(x: dict) -> list[str]:
    """Return the sweep table and the lesson's checks, computed from the stored numbers (docs/benchmarks/loading.md)."""
    rows = ["| num_workers | samples/s | busy | wait ms | step ms | model ms | model error (held out) |",
            "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in x["sweep"]:
        err = "fitted" if r["workers"] in x["fit_workers"] else f"{100 * r['model_error']:.1f}%"
        rows.append(f"| {r['workers']} | {r['samples_per_s']:.0f} | {100 * r['busy']:.0f}% | {r['wait_ms']:.1f} | "
                    f"{r['step_ms']:.1f} | {r['predicted_ms']:.1f} | {err} |")
    from types import SimpleNamespace

    from kit.checks import table
    from kit.data.lesson import model_checks, sweep_checks
    sweep, lesson = x["sweep"], x["lesson"]
    best, zero = next(r for r in sweep if r["workers"] == x["best_workers"]), sweep[0]
    res = {"rows": sweep, "best": best, "at_0": zero, "speedup": best["samples_per_s"] / zero["samples_per_s"]}
    load = SimpleNamespace(others=lesson["others"], cores=lesson["cores"])
    return ["\n".join(rows), table(sweep_checks(res, lesson["alone_ms"] / 1e3, load)
                                   + model_checks(sweep, x["fit"], x["fit_workers"]))]


def ps(x: dict) -> list[str]:
    """Return the bytes table, the model table, K (docs/benchmarks/ps.md)."""
    if not all(r["bytes_exact"] for r in x["training"]):
        raise ValueError("results/ps.json: a server's bytes per step were not N·K/k exactly")
    bytes_rows = ["| N | k | server in (B) | server out (B) | = N·K/k exactly |", "|---|---|---|---|---|"]
    bytes_rows += [f"| {r['N']} | {r['k']} | {r['server_in']:,} | {r['server_out']:,} | {r['bytes_exact']} |"
                   for r in x["training"]]
    model = ["| N | k | K (MB) | empty ms | measured ms | predicted ms | error | plain 2(α + N·K/B) ms | error |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in x["exchange"]:
        plain = r["measured_ms"] / r["predicted_one_host_ms"] - 1
        model.append(f"| {r['N']} | {r['k']} | {r['K'] / 1e6:.1f} | {r['empty_ms']:.2f} | {r['measured_ms']:.1f} | "
                     f"{r['predicted_ms']:.1f} | {r['error']:+.0%} | {r['predicted_one_host_ms']:.1f} | {plain:+.0%} |")
    return ["\n".join(bytes_rows), "\n".join(model), f"{x['training'][0]['K']:,}"]


def allreduce(x: dict) -> list[str]:
    """Return the busbw table, the fusion table, the model's size (MB) and points, α (µs), B (GB/s)
    (docs/benchmarks/allreduce.md)."""
    from kit.bench.allreduce import readme_table
    fusion = ["| 100 tensors of 4 KB | one by one | in one call |", "|---|---|---|"]
    fusion += [f"| {impl} | {1e3 * t['one_by_one']:.1f} ms | {1e3 * t['fused']:.1f} ms |"
               for impl, t in x["fusion_100x4KB_s"].items()]
    ring = ", ".join(f"N = {n}: {1e3 * s:.1f} ms" for n, s in x["model_points"]["kit ring"].items())
    return [readme_table(x), "\n".join(fusion), x["model_bytes"] >> 20, ring, f"{x['alpha_s'] * 1e6:.0f}",
            f"{x['B_bytes_per_s'] / 1e9:.2f}"]


def network(x: dict) -> list[str]:
    """Return the README tables (docs/benchmarks/network.md)."""
    from kit.plots.network import readme_tables
    from kit.netlab.exchange import reps_for
    return [readme_tables(x, max(x["sizes"]), small_reps=reps_for(min(x["sizes"]), x["reps"]))]


def mnist(x: dict) -> list[str]:
    """Return the throughput table, the accuracy seeds and the checks on both (docs/benchmarks/mnist.md)."""
    from kit.checks import table
    from kit.mnist import accuracy_table, bench_checks, gain_checks, readme_table
    return [readme_table(x)] + ([accuracy_table(x), table(bench_checks(x) + gain_checks(x))]
                                if "accuracy_seeds" in x else [])


def mnist_lab(x: dict) -> list[str]:
    """Return the scaling table, K, the lab section's checks (docs/benchmarks/mnist_lab.md)."""
    from kit import checks
    from kit.mnist.lab import claims, table
    return [table(x), f"{x['gradient_bytes']:,}", checks.table(claims(x))]


def measured_on(x: dict) -> list:
    """Return the machine's cores, PyTorch version, the date and the run's seconds."""
    m = x["machine"]
    return [m["cpu_cores"], m["versions"]["torch"], m["date"][:10], f"{x['seconds']:.0f}"]


def ddp(x: dict) -> list[str]:
    """Return the schemes table, ZeRO's stages, the Horovod note, the setup's numbers, the machine's, the sweep, the
    checks."""
    from kit.checks import table as checks_table
    from kit.ddp.lessons import all_checks, alpha_rows, sweep_rows
    from kit.ddp.memory import memory_table
    from kit.ddp.horovod import horovod_rows, negotiation_rows
    from kit.ddp.schemes import md, table
    cfg = x["cfg"]
    hvd = md(horovod_rows(x)) + (f"\n\n{md(negotiation_rows(x))}" if negotiation_rows(x) else "")
    return [table(x), memory_table(x), hvd, tuple(cfg["sizes"]), f"{x['K']:,}", x["tensors"], cfg["warmup"],
            cfg["reps"], x["N"], cfg["batch"], *measured_on(x),
            md(alpha_rows(x)), md(sweep_rows(x)), checks_table(all_checks(x))]


def ddp_lab(x: dict) -> list[str]:
    """Return the machine's and the setup's numbers, then per N: the table, the checks, the Horovod note and the
    timeline."""
    from kit.checks import table as checks_table
    from kit.ddp.lab import claims, rounds_rows, table, timeline_rows
    from kit.ddp.horovod import horovod_rows, negotiation_rows
    from kit.ddp.schemes import md
    first = x["runs"][0]
    out = [*measured_on(x), first["cfg"]["warmup"], first["cfg"]["reps"], first["cfg"]["batch"], f"{first['K']:,}",
           first["tensors"]]
    for run in x["runs"]:
        hvd = md(horovod_rows(run)) + (f"\n\n{md(negotiation_rows(run))}" if negotiation_rows(run) else "")
        out += [table(run), checks_table(claims(run)), hvd, f"{md(rounds_rows(run))}\n\n{md(timeline_rows(run))}"]
    return out


def elastic(x: dict) -> list[str]:
    """Return the runs table, the Gloo timeout (docs/benchmarks/elastic.md)."""
    from kit.mnist import elastic
    rows = []
    for i, run in enumerate(x["runs"], 1):
        again = elastic.summarize(run["events"], run["t_cut"], run["t_restore"])    # the events say the same
        if again["lost_batches"] != run["lost_batches"] or again["pauses"] != run["pauses"]:
            raise ValueError(f"results/elastic.json: run {i}'s lost batches or pauses are not what its events say")
        back = next((p["seconds"] for p in run["pauses"] if p["t"] > run["t_restore"]), 0.0)
        sizes = run["batches_at_size"]
        rows.append(f"| {i} | {run['seconds_to_carry_on']:.1f} s | {run['lost_batches'][0]} | "
                    f"{run['seconds_to_rejoin']:.1f} s | {back:.1f} s | {sizes.get('1', 0)} / {sizes.get('2', 0)} | "
                    f"{run['final_accuracy']:.3f} |")
    head = ("| run | h1 carried on, after the cut | batches lost | h2 rejoined, after the restore | training paused at "
            "the rejoin | batches at size 1 / 2 | last epoch's training accuracy |\n|---|---|---|---|---|---|---|")
    return ["\n".join([head, *rows]), x["gloo_timeout_s"]]


def gpu(x: dict) -> list[str]:
    """Return the machine's and the sizing's numbers, copies, the sweep, the allreduces (docs/benchmarks/gpu.md)."""
    sweep, c, m, sz = x["sweep"], x["copy_gbps"], x["machine"], x["sizing"]
    lo, hi = "0", max(sweep["False"], key=int)

    def row(key, fmt):
        return " | ".join(f"{fmt(sweep[p][lo][key])} → {fmt(sweep[p][hi][key])}" for p in ("False", "True"))
    pinned = sweep["True"]
    per_w = "\n".join(["| `num_workers` (pinned) | samples/s | busy | NVML utilisation |", "|---:|---:|---:|---:|"]
                      + [f"| {w} | {pinned[w]['samples_per_s']:.0f} | {100 * pinned[w]['busy']:.0f}% | "
                         f"{pinned[w]['gpu_util']:.1f}% |" for w in sorted(pinned, key=int)])
    ars = [f"| {a['backend']} | " + (a["error"] if "error" in a else
                                      f"{1000 * a['seconds']:.1f} ms, {a['busbw_gbps']:.1f} GB/s bus bandwidth") + " |"
           for a in x["allreduce"]]
    ars = "\n".join(["| 64 MB allreduce, 2 engines sharing the one GPU | result |", "|---|---|", *ars])
    return [x["gpu"], m["cpu_cores"], m["versions"]["python"], m["versions"]["torch"], m["versions"]["horovod"],
            sz["width"], f"{sz['t_step_ms']:.1f}", f"{sz['t_load_ms']:.1f}", x["steps"],
            f"{c['pageable']:.1f} GB/s | {c['pinned']:.1f} GB/s", f"W = {lo} → {hi}",
            row("samples_per_s", lambda v: f"{v:.0f}"), row("busy", lambda v: f"{100 * v:.0f}%"),
            row("gpu_util", lambda v: f"{v:.1f}%"), per_w, ars]


def ring_cpu(x: dict) -> list[str]:
    """Return the rows' table (docs/benchmarks/ring_cpu.md)."""
    from kit.bench.ring_cpu import table
    return [table(x)]


def mp(x: dict) -> list[str]:
    """Return docs/benchmarks/mp.md's blocks (kit.bench.mp.blocks)."""
    from kit.bench.mp import blocks
    return blocks(x)


def plan(x: dict) -> list[str]:
    """Return docs/benchmarks/plan.md's blocks (kit.bench.plan.blocks)."""
    from kit.bench.plan import blocks
    return blocks(x)


BLOCKS = {"loading": loading, "ps": ps, "allreduce": allreduce, "network": network, "mnist": mnist,
          "mnist_lab": mnist_lab, "elastic": elastic, "gpu": gpu, "ddp": ddp, "ddp_lab": ddp_lab,
          "ring_cpu": ring_cpu, "mp": mp, "plan": plan}
