"""The Horovod MNIST job on the emulated-host lab: when does the network start to matter? (notebook 04)

    with kit.netlab.start(hosts=4) as lab:
        runs = kit.mnist.lab.scaling(lab, sizes=(2, 4), rates=("1gbit", "10gbit"))
    kit.plots.plot_lab_scaling(runs)                  # samples/s and the allreduce's share of a step
    Markdown(kit.mnist.lab.note(runs, bench, "In this run", no_lab=None))   # the section's prose, its checks

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


def claims(result: dict, n: int = 2, gap: float = 0.10) -> list:
    """Return the lab section's two checks on `n` hosts: does the 1 Gbit/s link slow the job (by `gap` of the
    10 Gbit/s run's speed-up, as a step waiting for its whole allreduce would), and is the step's extra time over
    one worker no more than its allreduce (nothing else slowed the workers)?"""
    from kit.checks import Check
    by = {(r["n"], r["rate"]): r for r in result["runs"]}
    slow, fast, one = by[n, "1gbit"], by[n, "10gbit"], result["one_worker"]
    ms = lambda s: f"{1e3 * s:.0f} ms"          # noqa: E731
    extra = slow["step_s"] - one["step_s"]
    return [
        Check(f"1 vs 10 Gbit/s on {n} hosts",
              measured=f"{slow['speedup']:.2f}× one worker at 1 Gbit/s, {fast['speedup']:.2f}× at 10 Gbit/s "
                       f"({ms(slow['step_s'])} vs {ms(fast['step_s'])} a step)",
              bound=f"10 Gbit/s at least {gap:.0%} faster, as when a step waits for its whole allreduce",
              held=fast["speedup"] >= (1 + gap) * slow["speedup"],
              reason=f"the 1 Gbit/s step took {1e3 * (slow['step_s'] - fast['step_s']):+.0f} ms against the 10 Gbit/s "
                     f"one although its allreduce took {ms(slow['allreduce_s'] - fast['allreduce_s'])} longer: "
                     f"{max(0.0, hidden_share(result, slow)):.0%} of it ran behind the backward pass"),
        Check("only the exchange slows a step",
              measured=f"at 1 Gbit/s a step took {ms(extra)} more than one worker's, its allreduce "
                       f"{ms(slow['allreduce_s'])}",
              bound="no more than the allreduce",
              held=extra <= slow["allreduce_s"],
              reason=f"a worker kept only {min(slow['cores_busy']):.2f} of a core busy: it also waited outside the "
                     f"exchange (for a core of this shared machine, or for its peer)")]


def lesson(result: dict, n: int = 2) -> str:
    """Return what `result` says about the network: the rate below which no overlap can hide the wire, and the
    share of the 1 Gbit/s allreduce that hid behind compute above it."""
    by = {(r["n"], r["rate"]): r for r in result["runs"]}
    slow, fast = by[n, "1gbit"], by[n, "10gbit"]
    hidden = max(0.0, hidden_share(result, slow))
    return (f"The wire alone needs one worker's whole step ({1e3 * result['one_worker']['step_s']:.0f} ms) at "
            f"{crossover_rate(result, n) / 1e9:.2f} Gbit/s: below that rate, even an allreduce hidden entirely "
            f"behind compute leaves the workers waiting for the network. Above it, the network costs the part of the "
            f"allreduce that does not hide: here {hidden:.0%} of the 1 Gbit/s allreduce ran behind the backward "
            f"pass, and the 1 Gbit/s speed-up came out {slow['speedup'] / fast['speedup'] - 1:+.0%} against the "
            "10 Gbit/s one.")


def compare(result: dict, bench: dict, n: int = 2) -> str:
    """Return why `bench` (the committed benchmark) and `result` (this run) disagree, from their own numbers."""
    def at(res):
        r = {(r["n"], r["rate"]): r for r in res["runs"]}[n, "1gbit"]
        return r, r["step_s"] - res["one_worker"]["step_s"], min(r["cores_busy"])
    (r, extra, busy), (b, b_extra, b_busy) = at(result), at(bench)
    ms = lambda s: f"{1e3 * s:.0f} ms"          # noqa: E731
    same_wire = abs(r["allreduce_s"] - b["allreduce_s"]) <= 0.2 * b["allreduce_s"]
    # the run whose least busy worker had clearly less of a core, and whose step ran longer beyond one worker's
    where = "" if not same_wire or abs(busy - b_busy) < 0.1 or (busy < b_busy) != (extra > b_extra) else \
        "here" if busy < b_busy else "in the benchmark"
    return (f"Both timed {n} hosts at 1 Gbit/s: the allreduce took {ms(b['allreduce_s'])} in the benchmark and "
            f"{ms(r['allreduce_s'])} here ({'about the same' if same_wire else 'not the same'}), but a step ran "
            f"{ms(b_extra)} longer than one worker's there and {ms(extra)} here, with the least busy worker at "
            f"{b_busy:.2f} of a core there and {busy:.2f} here ({bench['runs'][0]['steps']} timed steps per run "
            f"there, {r['steps']} here). "
            + (f"The disagreement is not the network's: {where} a worker also waited outside the exchange (for a "
               "core, or for a peer slowed by the load on this shared machine), so less of its allreduce hid behind "
               "the backward pass." if where else "One run each: their own numbers do not single out one cause."))


def _at(result: dict) -> dict:
    """Return `result`'s runs keyed by (hosts, rate)."""
    return {(r["n"], r["rate"]): r for r in result["runs"]}


def exchange_note(result: dict, source: str, n: int = 2) -> str:
    """Return the section's opening: one worker's speed, then `n` hosts' allreduce at 1 and 10 Gbit/s beside the
    wire's own time; `source` says where the numbers come from ("In this run", or the committed run)."""
    one, slow, fast = result["one_worker"], _at(result)[n, "1gbit"], _at(result)[n, "10gbit"]
    return (f"{source}, one worker alone trained {one['samples_per_s']:,.0f} samples/s ({1e3 * one['step_s']:.0f} "
            f"ms per step). On {n} hosts the {result['gradient_bytes'] / 1e6:.1f} MB of gradients spent "
            f"{1e3 * slow['allreduce_s']:.0f} ms per step in the allreduce over 1 Gbit/s links, where the wire alone "
            f"needs {1e3 * slow['link_s']:.0f} ms, and {1e3 * fast['allreduce_s']:.0f} ms over 10 Gbit/s, where it "
            f"needs {1e3 * fast['link_s']:.1f} ms (the rest is Gloo's software on shared cores, not the wire).")


def bench_note(result: dict, bench: dict, n: int = 2) -> str:
    """Return the committed benchmark `bench` beside this run `result`: its speed-ups on `n` hosts, its checks
    (claims) and why the two disagree (compare)."""
    from kit.checks import markdown
    at = _at(bench)
    return (f"The committed benchmark (`python -m kit.bench mnist_lab`, {bench['machine']['date'][:10]}) ran {n} "
            f"hosts at {at[n, '1gbit']['speedup']:.2f}× and {at[n, '10gbit']['speedup']:.2f}×:\n\n"
            + markdown(claims(bench, n)) + "\n\n" + compare(result, bench, n))


def crowded_note(result: dict) -> str:
    """Return what the 4-host run at 10 Gbit/s measured (this machine's cores shared, two workers to a core), or ""
    where `result` has no such run."""
    four = _at(result).get((4, "10gbit"))
    if four is None:
        return ""
    return (f"With 4 hosts, 4 workers share this machine's {result['cores']} cores, {4 / result['cores']:g} to a core "
            f"(each worker busy "
            f"{sum(four['cores_busy']) / 4:.2f} of a core): a step took {1e3 * four['step_s']:.0f} ms even at 10 "
            f"Gbit/s, and the allreduce stretched with it ({1e3 * four['allreduce_s']:.0f} ms). Those points measure "
            f"this box; on a real cluster each host brings its own cores and only the wire's 2(N−1)/N × K / B grows "
            f"with N.")


def note(result: dict, bench: dict, source: str, no_lab: str | None) -> str:
    """Return the lab section's Markdown: the exchange on 2 hosts, the lab's checks, the lesson, the committed
    benchmark beside this run (where the lab ran here: `no_lab` is None) and the 4-host run (where there is one)."""
    from kit.checks import markdown
    parts = [exchange_note(result, source) + " The lab's checks:", markdown(claims(result)), lesson(result)]
    if no_lab is None:
        parts.append(bench_note(result, bench))
    four = crowded_note(result)
    return "\n\n".join(parts + ([four] if four else []))
