"""Notebook 01's and appendix 01a's lessons checked on their run, as kit.checks values (numbers, no sentences).

    alone = calibrate(step, dataset, batch)         # the step on a batch already in memory: what it takes here
    with MachineLoad() as load:                     # the CPU that OTHER processes used meanwhile
        res = sweep_experiment(dataset, step, ...)
    kit.checks.show(sweep_checks(res, alone, load) + model_checks(res["rows"], res["fit"], res["fit_workers"]))

The calibration is what the workload should take on this machine: the fastest of a few steps with nothing to
load. Beside it, the step's own compute during the sweep (with W = 0 and beside the workers) shows whether the
step had its cores, and `MachineLoad` whether another process was using them.
"""
from __future__ import annotations

import math
import os
import time

import psutil

from kit.checks import Check

SPEEDUP = 1.2       # the lesson holds when the best W gives at least this many times W = 0's samples/s
SLOWED = 1.5        # the step "was slowed" when it computed this many times its calibrated time
OTHERS = 0.25       # "other processes were busy" when they used this share of the cores


def calibrate(step, dataset, batch: int, reps: int = 10, sync=None) -> float:
    """Return the training step's time alone (s): the fastest of `reps` steps on one batch already in memory."""
    from kit.data.pipeline import make_loader
    x = next(iter(make_loader(dataset, batch, num_workers=0)))
    times = []
    for _ in range(reps + 1):
        t0 = time.perf_counter()
        step(x)
        if sync:
            sync()
        times.append(time.perf_counter() - t0)
    return min(times[1:])                           # the first is a warm-up


def load_time(dataset, batch: int, batches: int = 3) -> float:
    """Return the time (s) to load one batch in the training loop (num_workers=0): the median of `batches`."""
    from kit.data.pipeline import make_loader
    it, times = iter(make_loader(dataset, batch, num_workers=0)), []
    for _ in range(batches):
        t0 = time.perf_counter()
        next(it)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


WIDTHS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)      # each at most 1.5x the last: the step grows by at most ~2.25x


def size_step(time_step, t_load: float, target: float = 0.4, widths=WIDTHS) -> tuple[int, float]:
    """Return (width, seconds): the narrowest model width whose step, timed by `time_step(width)`, takes at least
    `target` x t_load, unless that step overshoots t_load (then the width before it, if its step is at least half
    the target); the widest if none is enough. A GPU runs the default CNN in a few ms, far below a batch's
    loading, so it idles whatever the loader does. With the step at s x t_load (s from 0.4 to about 0.9), loading
    in the loop keeps it busy s / (1 + s) of the time (29-47%), and enough workers nearly all of it:
    (1 + s) / s, 2.1-3.5x the samples/s, in notebook 01's model."""
    if not t_load > 0:
        raise ValueError(f"t_load must be a positive time in seconds, got {t_load!r}")
    before = None
    for width in widths:
        t = time_step(width)
        if t >= target * t_load:
            if t > t_load and before and before[1] >= target * t_load / 2:
                return before
            return width, t
        before = width, t
    return width, t


def size_model(dataset, batch: int, sync=None) -> tuple[int, float, float]:
    """Size notebook 01's CNN to this machine (a GPU): return (width, its step's seconds, a batch's loading
    seconds), the width from `size_step` with each width's step timed by `calibrate`."""
    from kit.data.pipeline import make_model, make_step
    t_load = load_time(dataset, batch)
    width, t_step = size_step(lambda w: calibrate(make_step(make_model(w)), dataset, batch, reps=3, sync=sync), t_load)
    return width, t_step, t_load


def steps_for_nvml(t_step: float, steps: int, seconds: float = 2.0) -> int:
    """Return how many steps each GPU measurement takes: `steps`, or enough of the sized step (`t_step` s) to run
    `seconds`. NVML's utilisation reading averages its last sample period (up to 1 s, `monitor.NVML_LAG`): 30 steps
    of 16 ms read mostly the workers' start (the H200 read 54% at W=16 with the step busy 99%; 96% over 2 s)."""
    if not t_step > 0:
        raise ValueError(f"t_step must be a positive time in seconds, got {t_step!r}")
    return max(steps, math.ceil(seconds / t_step))


def worker_counts(cores: int) -> tuple[int, ...]:
    """The num_workers sweep for a machine of `cores` cores: 0, 1, 2, 4 and on, doubling, up to the core count."""
    out, w = [0, 1, 2, 4], 8
    while w < cores:
        out.append(w)
        w *= 2
    return tuple(sorted(set(out) | ({cores} if cores > 4 else set())))


class MachineLoad:
    """Inside the block, the share of the machine's cores that processes other than this one and its (reaped)
    children kept busy: `others` (0 = quiet, 1 = every core busy with someone else's work), `cores`, `seconds`."""

    def __enter__(self):
        self.cores = psutil.cpu_count() or os.cpu_count() or 1
        self._t, self._machine, self._ours = time.perf_counter(), _busy(psutil.cpu_times()), _ours()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self._t
        busy = _busy(psutil.cpu_times()) - self._machine
        self.others = min(1.0, max(0.0, busy - (_ours() - self._ours)) / (self.seconds * self.cores))
        return False


def _busy(t) -> float:
    return sum(v for k, v in t._asdict().items() if k not in ("idle", "iowait", "steal", "guest", "guest_nice"))


def _ours() -> float:
    t = psutil.Process().cpu_times()
    return t.user + t.system + t.children_user + t.children_system


def sweep_checks(res: dict, alone: float, load: MachineLoad | None = None) -> list[Check]:
    """Return notebook 01's checks on `res` (kit.data.sweep_experiment's result): the best W's samples/s over
    W = 0's (at least SPEEDUP), and the machine it ran on: the step beside the workers against its calibrated
    time `alone` (s), and the cores other processes kept busy (`load`)."""
    best = res["best"]
    beside = max(r["compute_ms"] for r in res["rows"] if r["workers"])
    checks = [Check(f"samples/s, W={best['workers']} over W=0", round(res["speedup"], 2), f"≥ {SPEEDUP}",
                    best["workers"] != 0 and res["speedup"] >= SPEEDUP, unit="×"),
              Check("step beside workers over step alone", round(beside / (1e3 * alone), 2), f"< {SLOWED}",
                    beside / (1e3 * alone) < SLOWED, unit="×")]
    if load is not None:
        checks.append(Check("cores busy with other processes", round(load.others, 2), f"< {OTHERS}",
                            load.others < OTHERS))
    return checks


MODEL_TOL = 0.10    # the model's step time is right within 10%, or within the rounds' spread where that is wider


def model_checks(rows: list[dict], fit: dict, fitted) -> list[Check]:
    """Return one check per W the model was not fitted to: the measured step (ms) within max(MODEL_TOL, the step's
    spread over the rounds) of the predicted one. The name says which side of max() set the pace: "loader" is a
    real prediction, "step" repeats the step time fitted at the W > 0 run."""
    from kit.data.monitor import effective_workers
    pace = fit["t_compute"] + fit["t_handover"]
    out = []
    for r in (r for r in rows if r["workers"] not in fitted):
        w = r["workers"]
        w_eff = effective_workers(w, fit["t_load"], fit["t_load_cpu"], fit["c_compute"], fit["cores"]) if w else 0
        side = "loop" if w == 0 else "loader" if fit["t_load"] / w_eff > pace else "step"
        tol = max(MODEL_TOL, r["step_spread"])
        out.append(Check(f"model, W={w} ({side} sets the pace)", r["step_ms"],
                         f"{r['predicted_ms']:.1f} ms ± {tol:.0%}", r["model_error"] <= tol, unit=" ms"))
    return out


FLOOR_TOL = 0.05    # the fastest step with workers may beat the cores' floor by this share (timing noise)


def cpu_checks(rows: list[dict], fit: dict, speedup: float = SPEEDUP, tol: float = FLOOR_TOL) -> list[Check]:
    """Return section 5's checks on a CPU-bound pipeline's sweep (`rows`, `fit`): the workers' best samples/s over
    W = 0's (at least `speedup`), and the fastest step with workers no faster than the cores' floor
    (t_load_cpu + c_compute) / cores, less `tol`."""
    gain = max(r["samples_per_s"] for r in rows) / rows[0]["samples_per_s"]
    floor = 1e3 * (fit["t_load_cpu"] + fit["c_compute"]) / fit["cores"]
    fastest = min((r for r in rows if r["workers"] > 0), key=lambda r: r["step_ms"])
    return [Check("CPU pipeline: best samples/s over W=0", round(gain, 2), f"≥ {speedup}", gain >= speedup, unit="×"),
            Check(f"CPU pipeline: fastest step (W={fastest['workers']}) vs the cores' floor", fastest["step_ms"],
                  f"≥ {floor * (1 - tol):.1f} ms", fastest["step_ms"] >= floor * (1 - tol), unit=" ms")]


def advice_check(predicted: float, measured: float, tol: float = 0.20) -> Check:
    """Return profile_loader's advice checked: the measured step (s) within `tol` of its predicted one."""
    return Check("profile_loader's predicted step", round(1e3 * measured, 1),
                 f"{1e3 * predicted:.1f} ms ± {tol:.0%}", abs(measured / predicted - 1) <= tol, unit=" ms")


NOISE = 0.10        # appendix 01a: one run per setting on a shared machine; a smaller difference is no evidence


def spread_check(name: str, rates: list[float], noise: float = NOISE) -> Check:
    """Return whether settings' samples/s (`rates`) differ by no more than `noise` (max / min - 1): within the
    band, one run each cannot rank them."""
    spread = max(rates) / min(rates) - 1
    return Check(name, round(spread, 3), f"≤ {noise}", spread <= noise)


def prefetch_check(rows: list[dict], load_ms: float, compute_ms: float, batch: int, noise: float = NOISE) -> Check:
    """Return whether buffered runs (`rows`) stayed within one batch per max(load_ms, compute_ms), + `noise`: a
    buffer overlaps loading with the step, it does not make either faster."""
    pace = 1e3 * batch / max(load_ms, compute_ms)
    best = max(r["samples_per_s"] for r in rows)
    return Check("a buffer on the serial map: samples/s", round(best), f"≤ {pace * (1 + noise):.0f}",
                 best <= pace * (1 + noise))


# --- the stall in a torch.profiler trace ------------------------------------------------------------------------
TRACE_TOL = 0.10    # the trace's data-wait share and the sweep's (1 - busy) agree within 10 points


def trace_runs(dataset, step, workers, batch: int, folder, active: int = 5, sync=None) -> dict:
    """Record a few steps at each W in `workers` with torch.profiler into folder/loading_W{W}.json.gz; return {W:
    {"path", "trace" (the JSON read back), "nvml": NVML utilisation samples (%) taken meanwhile, empty without}}.
    The schedule skips 1 step plus the batches the workers may hold queued (`pipeline.queued`), warms up 1, records
    `active`: the recorded steps see the loader's steady pace, not the queue it filled while starting."""
    from pathlib import Path

    from kit import trace
    from kit.data.monitor import Monitor
    from kit.data.pipeline import make_loader, queued
    out = {}
    for w in workers:
        loader = make_loader(dataset, batch, w)
        path = Path(folder) / f"loading_W{w}.json.gz"
        with Monitor(warmup=0) as mon:                 # its NVML thread only, on a GPU: what NVML saw meanwhile
            trace.record_loop(loader, step, path, wait=1 + queued(loader), warmup=1, active=active, sync=sync)
        out[w] = {"path": path, "trace": trace.load(path), "nvml": [u for _, u, _ in mon.samples]}
    return out


def trace_checks(traced: dict, rows: list[dict], tol: float = TRACE_TOL) -> list[Check]:
    """Return per traced W the trace's data-wait share (the DataLoader's __next__ spans / the ProfilerStep spans)
    against the sweep's wait share at that W (1 - busy, from `rows`) within `tol`; on a GPU, also the kernels'
    share against NVML's mean utilisation (within 0.15)."""
    from kit import trace
    by_w, out = {r["workers"]: r for r in rows}, []
    for w, run in traced.items():
        got, ref = trace.data_wait(run["trace"])["wait_share"], 1 - by_w[w]["busy"]
        out.append(Check(f"W={w}: trace's data-wait share", round(got, 3), f"{ref:.3f} ± {tol}",
                         abs(got - ref) <= tol))
        if any(s.cat in trace.KERNEL_CATS for s in trace.spans(run["trace"])):
            busy, nvml = trace.device_busy(run["trace"]), run["nvml"]
            mean = sum(nvml) / len(nvml) / 100 if nvml else float("nan")
            out.append(Check(f"W={w}: trace's kernel share", round(busy, 3), f"{mean:.3f} ± 0.15 (NVML)",
                             bool(nvml) and abs(busy - mean) <= 0.15))
    return out


# --- notebook 01's exercises, graded without showing the answer -------------------------------------------------
EXERCISE_2 = dict(t_load=0.090, t_compute=0.030, t_load_cpu=0.0, c_compute=0.003, cores=8)    # all I/O, 8 cores
EXERCISE_3 = dict(t_load=0.090, t_compute=0.030, t_load_cpu=0.090, c_compute=0.030, cores=2)  # all CPU, 2 cores


def grade(exercise: int, answer, fit: dict | None = None) -> str:
    """Return notebook 01's verdict on `answer` to exercise 1 (W_eff at W = 8 from `fit`), 2 (the fewest workers
    for 90% busy) or 3 (the best busy fraction): 'not answered yet', 'correct' or 'wrong', never the answer."""
    from kit.data.monitor import effective_workers, predict_busy
    if exercise not in (1, 2, 3):
        raise ValueError(f"exercise must be 1, 2 or 3, got {exercise!r}")
    if answer is None:
        return f"exercise {exercise}: not answered yet"
    if exercise == 1:
        if fit is None:
            raise ValueError("exercise 1 is graded on your run's fit: grade(1, answer, fit)")
        truth = effective_workers(8, fit["t_load"], fit["t_load_cpu"], fit["c_compute"], fit["cores"])
        right = abs(answer - truth) <= 0.03 * truth
    elif exercise == 2:
        right = predict_busy(answer, **EXERCISE_2) >= 0.9 > predict_busy(answer - 1, **EXERCISE_2)
    else:
        right = abs(answer - max(predict_busy(w, **EXERCISE_3) for w in range(1, 33))) < 0.02
    return f"exercise {exercise}: {'correct' if right else 'wrong'}"
