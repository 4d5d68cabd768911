"""The Horovod MNIST job on the emulated-host lab: when does the network start to matter? (notebook 04)

    with kit.netlab.start(hosts=4) as lab:
        runs = kit.mnist.lab.scaling(lab, sizes=(2, 4), rates=("1gbit", "10gbit"))
    kit.plots.plot_lab_scaling(runs)                  # samples/s and the allreduce's share of a step
    kit.checks.show(kit.mnist.lab.claims(runs))       # the section's checks

Each run is `horovodrun --gloo -np N -H h1:1,...,hN:1 python scripts/train_keras_mnist.py --synthetic-steps S`
started on h1, one worker per host, with Horovod's timeline on: samples/s from the script, the exchange time per
step from the timeline (the fused gradient allreduces, after the warm-up steps), and beside it what the link alone
needs for the ring's 2(N-1)/N x K bytes per worker. The lab's hosts share this machine's cores: with more workers
than cores, each worker's compute slows down too (the runs record CPU time / wall time per worker).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from kit import scratch
from kit.mnist import timeline
from kit.mnist.script import REPO, TRAIN
from kit.mnist.throughput import SYNTHETIC_WARMUP as WARMUP  # steps left out of samples/s

# one compute thread per worker, pinned to core (rank mod cores): the lab's hosts share this machine's cores (on
# a real cluster, one worker per host, --pin would pin by local rank; here every local rank is 0)
THREADS = ["--threads", "1", "--inter-op-threads", "1", "--pin-by-rank"]


def gradient_bytes() -> int:
    """Return the bytes one step's gradients take (float32): what each worker's allreduce reduces, K."""
    from kit.mnist.model import build_model
    from kit.mnist.tfimport import import_tf_quietly
    import_tf_quietly()
    return 4 * int(sum(w.shape.num_elements() for w in build_model().trainable_weights))


def ring_seconds(n: int, k_bytes: int, rate: str) -> float:
    """Return the link's time for one ring allreduce of `k_bytes` on `n` workers: 2(n-1)/n * K / B."""
    from kit.netlab.lab import parse_rate
    return 2 * (n - 1) / n * k_bytes / (parse_rate(rate) / 8)


def run_on_lab(lab, n: int, steps: int = 30, timeout: float = 600) -> dict:
    """Run the synthetic MNIST job on the lab's first `n` hosts (1 worker each) at the lab's current rate."""
    if not 1 <= n <= len(lab.hosts):
        raise ValueError(f"n={n}: the lab has {len(lab.hosts)} hosts; start it with netlab.start(hosts={n})")
    if steps < 1:
        raise ValueError(f"steps={steps}: give at least 1 timed step (the job runs {WARMUP} warm-up steps first)")
    folder = scratch.make("mnist-lab")
    out, trace = Path(folder, "result.json"), Path(folder, "timeline.json")
    bin_ = Path(sys.executable).parent
    # one worker: the script alone (hvd.init() makes a job of size 1; horovodrun -H h1:1 with the lab's
    # --network-interface finds no interface for a purely local job)
    launcher = [str(bin_ / "horovodrun"), "--gloo", *lab.horovodrun_args(1, lab.hosts[:n])] if n > 1 else []
    cmd = [*launcher, sys.executable, *TRAIN, "--synthetic-steps", str(steps), *THREADS, "--json", str(out)]
    try:
        p = lab.launch(lab.hosts[0], cmd, cwd=str(REPO), env={"HOROVOD_TIMELINE": str(trace)},
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            log, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            lab.kill_jobs()
            raise RuntimeError(f"the MNIST job on {n} lab hosts did not finish within {timeout:.0f} s") from None
        if p.returncode or not out.exists():
            raise RuntimeError(f"the MNIST job on {n} lab hosts failed ({p.returncode}):\n{log[-2000:]}")
        result = json.loads(out.read_text())
        intervals = timeline.read_timeline(trace) if n > 1 else []       # one worker exchanges nothing
    finally:
        scratch.remove(folder)
    step_s = result["batch"] * n / result["samples_per_s"]        # the slowest worker's seconds per step
    exchange = timeline.allreduce_seconds_per_step(intervals, skip_steps=WARMUP) if n > 1 else 0.0
    return {"n": n, "rate": lab.rate, "samples_per_s": result["samples_per_s"], "step_s": step_s,
            "allreduce_s": exchange, "allreduce_share": exchange / step_s,
            "cores_busy": result["cores_busy"], "steps": steps, "batch": result["batch"]}


def scaling(lab, sizes=(2, 4), rates=("1gbit", "10gbit"), steps: int = 30, skip=()) -> dict:
    """Run the job on 1 host, then on each of `sizes` hosts at each link rate, leaving out the (hosts, rate) pairs
    in `skip`; restore the lab's rate after."""
    k = gradient_bytes()
    before, runs = lab.rate, []
    try:
        one = run_on_lab(lab, 1, steps)
        for rate in rates:
            lab.set_rate(rate)
            for n in (n for n in sizes if (n, rate) not in skip):
                r = run_on_lab(lab, n, steps)
                runs.append({**r, "speedup": r["samples_per_s"] / one["samples_per_s"],
                             "link_s": ring_seconds(n, k, rate)})
    finally:
        lab.set_rate(before)
    return {"gradient_bytes": k, "one_worker": one, "runs": runs, "cores": len(os.sched_getaffinity(0))}


def check(result: dict) -> None:
    """Raise AssertionError naming each claim of notebook 04's lab section that `result` (from `scaling`) breaks:
    every run's gradients crossed its link each step, so the exchange is no faster than the wire allows (tbf's 2 ms
    burst aside) and shorter than the step holding it; shares, speed-ups and the wire's time follow from the
    measured numbers; each worker reported its cores."""
    one, bad = result["one_worker"], []
    if not (one["n"] == 1 and one["allreduce_s"] == 0 and one["samples_per_s"] > 0 and len(one["cores_busy"]) == 1):
        bad.append(f"one worker alone: {one}")
    for r in result["runs"]:
        at = f"{r['n']} hosts at {r['rate']}"
        if abs(r["link_s"] - ring_seconds(r["n"], result["gradient_bytes"], r["rate"])) > 1e-9:
            bad.append(f"{at}: link alone {r['link_s']} s is not 2(N-1)/N x K / B")
        if not 0.8 * r["link_s"] < r["allreduce_s"] < r["step_s"]:
            bad.append(f"{at}: the allreduce took {1e3 * r['allreduce_s']:.1f} ms, not between 0.8 x the wire's "
                       f"{1e3 * r['link_s']:.1f} ms and the step's {1e3 * r['step_s']:.1f} ms")
        if abs(r["allreduce_share"] - r["allreduce_s"] / r["step_s"]) > 1e-9 or \
                abs(r["speedup"] - r["samples_per_s"] / one["samples_per_s"]) > 1e-9:
            bad.append(f"{at}: share or speed-up do not follow from the measured times")
        if len(r["cores_busy"]) != r["n"]:
            bad.append(f"{at}: {len(r['cores_busy'])} workers reported their cores, not {r['n']}")
    if bad:
        raise AssertionError("this run contradicts the lab section's lesson:\n- " + "\n- ".join(bad))


def table(result: dict) -> str:
    """Return the runs as a markdown table: notebook 04 shows it, as docs/benchmarks/mnist_lab.md does."""
    one = result["one_worker"]
    out = ["| link | hosts | samples/s | speed-up | ms per step | allreduce ms (share) | link alone ms | "
           "cores busy per worker |", "|---|---|---|---|---|---|---|---|",
           f"| none | 1 | {one['samples_per_s']:,.0f} | 1.00× | {1e3 * one['step_s']:.0f} | – | – | "
           f"{one['cores_busy'][0]:.2f} |"]
    for r in result["runs"]:
        out.append(f"| {r['rate']} | {r['n']} | {r['samples_per_s']:,.0f} | {r['speedup']:.2f}× | "
                   f"{1e3 * r['step_s']:.0f} | {1e3 * r['allreduce_s']:.1f} ({r['allreduce_share']:.0%}) | "
                   f"{1e3 * r['link_s']:.1f} | {sum(r['cores_busy']) / r['n']:.2f} |")
    return "\n".join(out)


def crossover_rate(result: dict, n: int = 2, fraction: float = 1.0) -> float:
    """Return the link rate (bit/s) at which the ring's transfer on `n` workers takes `fraction` of one worker's
    step (its compute): below it, the wire costs more than that share of a step."""
    step = result["one_worker"]["step_s"]
    return 2 * (n - 1) / n * result["gradient_bytes"] * 8 / (fraction * step)


def hidden_share(result: dict, run: dict) -> float:
    """Return the share of `run`'s allreduce that hid behind compute: 1 - (its step - one worker's) / allreduce."""
    return 1 - (run["step_s"] - result["one_worker"]["step_s"]) / run["allreduce_s"]


LINK_GAP = 0.10     # a step waiting for its whole allreduce: 10 Gbit/s at least this much faster than 1 Gbit/s


def claims(result: dict, n: int = 2, gap: float = LINK_GAP) -> list:
    """Return the lab section's two checks on `n` hosts: the 10 Gbit/s run's speed-up over the 1 Gbit/s run's (at
    least 1 + `gap`, as when a step waits for its whole allreduce), and the 1 Gbit/s step's time beyond one
    worker's, no more than its allreduce (nothing else slowed the workers)."""
    from kit.checks import Check
    by = {(r["n"], r["rate"]): r for r in result["runs"]}
    slow, fast, one = by[n, "1gbit"], by[n, "10gbit"], result["one_worker"]
    ratio, extra = fast["speedup"] / slow["speedup"], slow["step_s"] - one["step_s"]
    return [Check(f"{n} hosts: speed-up at 10 Gbit/s over 1 Gbit/s", round(ratio, 2), f"≥ {1 + gap:.2f}",
                  ratio >= 1 + gap, unit="×"),
            Check(f"{n} hosts, 1 Gbit/s: step − one worker's step", round(1e3 * extra, 1),
                  f"≤ {1e3 * slow['allreduce_s']:.1f} ms (its allreduce)", extra <= slow["allreduce_s"], unit=" ms")]


def numbers(result: dict, n: int = 2) -> dict:
    """Return the section's derived numbers on `n` hosts: the rate (Gbit/s) at which the wire alone takes one
    worker's step, and the share of the 1 Gbit/s allreduce hidden behind compute."""
    slow = {(r["n"], r["rate"]): r for r in result["runs"]}[n, "1gbit"]
    return {"crossover_gbit": round(crossover_rate(result, n) / 1e9, 3),
            "hidden_share_1gbit": round(hidden_share(result, slow), 3)}
