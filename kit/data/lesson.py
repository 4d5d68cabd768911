"""Notebook 01's lesson checked on its own run: did loading in parallel raise throughput, and if not, why not?

    alone = calibrate(step, dataset, batch)         # the step on a batch already in memory: what it takes here
    with MachineLoad() as load:                     # the CPU that OTHER processes used meanwhile
        res = sweep_experiment(dataset, step, ...)
    held, text = verdict(res, alone, load)          # judged by throughput; the machine's state said either way

The calibration is what the workload should take on this machine: the fastest of a few steps with nothing to
load. Beside it, the step's own compute during the sweep (with W = 0 and beside the workers) shows whether the
step had its cores, and `MachineLoad` whether another process was using them.
"""
from __future__ import annotations

import math
import os
import time

import psutil

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


def verdict(res: dict, alone: float, load: MachineLoad | None = None) -> tuple[bool, str]:
    """Judge the lesson on `res` (kit.data.sweep_experiment's result) by throughput; say how the step fared
    against its calibrated time `alone` (s) and what `load` saw. Return (held, markdown)."""
    rows, best, zero = res["rows"], res["best"], res["at_0"]
    w = best["workers"]
    held = w != 0 and res["speedup"] >= SPEEDUP
    ups = [b / z for (b, _), (z, _) in zip(best["rounds"], zero["rounds"])]
    per_round = f" (per round {min(ups):.1f}x-{max(ups):.1f}x over {len(ups)} rounds)" if len(ups) > 1 else ""
    beside = max((r for r in rows if r["workers"]), key=lambda r: r["compute_ms"])
    slowed = beside["compute_ms"] / (1e3 * alone)
    machine = (f"The step alone took {1e3 * alone:.1f} ms (calibration); it computed {zero['compute_ms']:.1f} ms "
               f"per step with loading in the loop and up to {beside['compute_ms']:.1f} ms beside the workers "
               f"(num_workers={beside['workers']}, {slowed:.1f}x its time alone)")
    busy_others = load is not None and load.others >= OTHERS
    if load is not None:
        machine += (f"; other processes kept {load.others:.0%} of the {load.cores} cores busy during the sweep")
    if held:
        text = (f"Loading in the training loop kept the step busy {zero['busy']:.0%} of the time; num_workers={w} "
                f"raised throughput {res['speedup']:.1f}x{per_round}, busy {best['busy']:.0%}: the workers fed "
                f"it. {machine}.")
        if slowed >= SLOWED or busy_others:
            text += " The machine was busy, and the workers still paid off."
        return True, text
    why = ("the workers took cores the step needed" if slowed >= SLOWED else
           "the cores were shared with other work" if busy_others else
           "loading was not what held the step back here (the step was not slowed and the machine was quiet)")
    return False, (f"**This run does not show the lesson**: the most samples/s were at num_workers={w}, "
                   f"{res['speedup']:.2f}x of loading in the loop{per_round}. {machine}: {why}. "
                   + ("Re-run on a quiet machine, or with fewer workers." if slowed >= SLOWED or busy_others else
                      "Make loading slower than the step (a larger `IO_MS`) to see what workers are for."))


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


def trace_check(traced: dict, rows: list[dict], tol: float = TRACE_TOL) -> tuple[bool, str]:
    """Check each traced W's data-wait share (the DataLoader's __next__ spans / the ProfilerStep spans) against the
    sweep's wait share at that W (1 - busy, from `rows`); on a GPU, the kernels' share against NVML. Return (held,
    markdown), saying for a check that did not hold what differed."""
    from kit import trace
    by_w, said, held = {r["workers"]: r for r in rows}, [], True
    for w, run in traced.items():
        got, row = trace.data_wait(run["trace"]), by_w[w]
        ok, text = trace.agree(f"num_workers={w}: the trace's data-wait share", got["wait_share"], 1 - row["busy"],
                               "the sweep's (1 - busy)", tol)
        if not ok:
            pace = "slower" if got["step_ms"] > row["step_ms"] else "faster"
            text += (f"; the {got['steps']} traced steps took {got['step_ms']:.1f} ms each against the sweep's "
                     f"{row['step_ms']:.1f} ms: that short run went {pace} than the sweep's rounds")
        said.append(text)
        held &= ok
        if any(s.cat in trace.KERNEL_CATS for s in trace.spans(run["trace"])):
            ok, text = trace.check_nvml(trace.device_busy(run["trace"]), run["nvml"])
            said.append(f"num_workers={w}: {text}")
            held &= ok
    return held, "; ".join(said) + "."


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
