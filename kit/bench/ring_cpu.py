"""`python -m kit.bench ring_cpu` (root: kit.netlab): what limits the kit's ring against torch.distributed's at N
hosts on the 1 Gbit/s lab: time, busbw, and the CPU the engines and the whole machine spent per call, for
torch.distributed's all_reduce and the kit ring at several piece sizes (docs/benchmarks/ring_cpu.md, and
docs/benchmarks/network.md, "Bandwidth"). A lab per N (2, 4, 8); about a minute at N = 8 on 2 cores.
"""
from __future__ import annotations

import json

import numpy as np
import psutil

from kit import checks
from kit import cluster as kc
from kit import netlab
from kit.comm import lessons

K, REPS = 64 << 20, 3
RUNS = [("torch", 0), ("ring", 4 << 20), ("ring", 1 << 20), ("ring", 16 << 20), ("torch", 0), ("ring", 4 << 20)]


def engine(impl: str, nbytes: int, reps: int, piece: int) -> dict:
    """On each engine: one untimed call, then `reps` timed ones; this process's CPU seconds (all threads) per call."""
    import time

    import psutil
    import torch
    import torch.distributed as dist

    from kit.comm.ring import allreduce
    y = torch.ones(nbytes // 4)
    run = (lambda: dist.all_reduce(y)) if impl == "torch" else (lambda: allreduce(y, check=False, piece_bytes=piece))
    run()
    dist.barrier()
    p, secs, ok, cpu = psutil.Process(), [], True, 0.0
    for _ in range(reps):
        y.fill_(1.0)
        dist.barrier()
        c0, t0 = p.cpu_times(), time.perf_counter()
        run()
        secs.append(time.perf_counter() - t0)
        c1 = p.cpu_times()
        cpu += c1.user - c0.user + c1.system - c0.system
        ok = ok and bool((y == dist.get_world_size()).all())
    return {"seconds": secs, "cpu": cpu / reps, "ok": ok}


def measure(n: int, nbytes: int = K) -> list[dict]:
    """Run every RUNS entry on a lab of n hosts at 1 Gbit/s, one engine each; return one row per run."""
    rows = []
    with netlab.start(hosts=n, rate="1gbit") as lab:
        with kc.start(n=n, backend="gloo", hosts=lab, timeout=300, quiet=True) as c:
            c.init_process_group()
            for impl, piece in RUNS:
                m0 = psutil.cpu_times()
                per_rank = c.wait(c.view.apply_async(engine, impl, nbytes, REPS, piece))
                m1 = psutil.cpu_times()
                busy = sum(getattr(m1, f) - getattr(m0, f) for f in ("user", "system", "irq", "softirq", "nice"))
                idle = m1.idle - m0.idle + m1.iowait - m0.iowait
                t = float(np.median([max(r["seconds"][i] for r in per_rank) for i in range(REPS)]))
                rows.append({"impl": impl, "piece_bytes": piece, "N": n, "bytes": nbytes, "seconds": t,
                             "busbw_share": nbytes / t * 2 * (n - 1) / n / (netlab.parse_rate("1gbit") / 8),
                             "engine_cpu_s_per_call": sum(r["cpu"] for r in per_rank),
                             "machine_busy": busy / (busy + idle), "ok": all(r["ok"] for r in per_rank)})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def summary(rows: list[dict]) -> str:
    """Return the one-line summary: per N, the kit's ring (4 MB pieces) and torch.distributed as shares of the
    link (medians), then the checks: the two level within the noise band at every N, every sum correct."""
    share = {(r["N"], r["impl"]): float(np.median([q["busbw_share"] for q in rows if q["N"] == r["N"] and
                                                   q["impl"] == r["impl"] and q["piece_bytes"] in (0, 4 << 20)]))
             for r in rows}
    ns = sorted({n for n, _ in share})
    cs = [lessons.same_check(f"N={n}: kit ring / torch.distributed busbw", share[n, "ring"], share[n, "torch"])
          for n in ns]
    cs.append(lessons.equal_check("sums correct", {f"{r['N']} {r['impl']} {r['piece_bytes']} {i}": r["ok"]
                                                   for i, r in enumerate(rows)}))
    return (f"ring_cpu {rows[0]['bytes'] >> 20} MB, 1gbit, busbw/link (kit ring 4 MB pieces / torch.distributed): "
            + ", ".join(f"N={n} {share[n, 'ring']:.0%}/{share[n, 'torch']:.0%}" for n in ns)
            + f"; checks {checks.summary_line(cs)}")


SETTINGS = {"tiny": dict(ns=(2,), nbytes=4 << 20), "quick": dict(ns=(2,), nbytes=K),
            "full": dict(ns=(2, 4, 8), nbytes=K)}


def bench(out_dir, quick: bool = False, tiny: bool = False):
    """Measure each N of the setting; return the rows and the summary."""
    from kit.bench import say
    s = SETTINGS["tiny" if tiny else "quick" if quick else "full"]
    rows = []
    for n in s["ns"]:
        say(f"ring_cpu: a lab of {n} hosts at 1gbit")
        rows += measure(n, s["nbytes"])
    return {"rows": rows}, summary(rows)


def table(x: dict) -> str:
    """The markdown table of a run: per N and implementation, time, share of the link, CPU per call."""
    out = ["| N | implementation | pieces | ms per call | busbw / link | engines' CPU s per call | machine busy |",
           "|---:|---|---:|---:|---:|---:|---:|"]
    for r in x["rows"]:
        pieces = f"{r['piece_bytes'] >> 20} MB" if r["piece_bytes"] else "–"
        name = "torch.distributed" if r["impl"] == "torch" else "kit ring"
        out.append(f"| {r['N']} | {name} | {pieces} | {1e3 * r['seconds']:.0f} | {r['busbw_share']:.0%} | "
                   f"{r['engine_cpu_s_per_call']:.2f} | {r['machine_busy']:.0%} |")
    return "\n".join(out)
