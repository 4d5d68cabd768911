"""Samples/s of the MNIST CNN on synthetic data: one rank or a Horovod job (notebook 04a, kit.mnist.train
--synthetic-steps), paired 1- vs N-worker runs, and their tables."""
from __future__ import annotations

import os

import numpy as np

from kit.checks import Check
from kit.mnist.callbacks import throughput_callback
from kit.mnist.model import BASE_LR, BATCH, build_model

SYNTHETIC_WARMUP = 10   # steps synthetic_throughput runs before it starts timing (graph building, first sync)


def engine_throughput(steps: int = 60, distributed: bool = True) -> dict:
    """Run synthetic_throughput on an engine: with Horovod (every rank must call it) or as one plain process."""
    import horovod.tensorflow.keras as hvd
    return synthetic_throughput(hvd if distributed else None, steps=steps)


def synthetic_throughput(hvd=None, steps: int = 60, warmup: int = SYNTHETIC_WARMUP, batch: int = BATCH) -> dict:
    """Train the CNN on random data for warmup + steps batches per rank; return the job's samples/s.

    hvd=None: one plain Keras process (the baseline); else every rank of the Horovod job must call it.
    """
    import tensorflow as tf
    rank, size = (hvd.rank(), hvd.size()) if hvd else (0, 1)
    rng = np.random.default_rng(rank)
    n = (warmup + steps) * batch
    x, y = rng.random((n, 28, 28, 1), dtype=np.float32), rng.integers(0, 10, n)
    model = build_model()
    opt = tf.keras.optimizers.Adam(BASE_LR * size)
    out = {}
    callbacks = [throughput_callback(warmup, batch, size, out)]
    if hvd:
        opt = hvd.DistributedOptimizer(opt)                                # Horovod: average gradients
        callbacks.append(hvd.callbacks.BroadcastGlobalVariablesCallback(0))  # Horovod: same start
    model.compile(loss="sparse_categorical_crossentropy", optimizer=opt, metrics=["accuracy"])
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
    if hvd:
        from horovod.tensorflow import allgather_object
        every = allgather_object(out, name="kit.mnist.throughput")
    else:
        every = [out]
    return {"size": size, "samples_per_s": min(r["samples_per_s"] for r in every),
            "cores_busy": [round(r["cores_busy"], 2) for r in every], "steps": steps, "batch": batch,
            "intra_op": os.environ.get("TF_NUM_INTRAOP_THREADS", "default"),
            "inter_op": os.environ.get("TF_NUM_INTEROP_THREADS", "default"),
            "affinity": sorted(os.sched_getaffinity(0))}


def paired_runs(one, many, repeats: int, n: int) -> dict:
    """Alternate one() and many() `repeats` times; return the runs, medians and the paired speed-up.

    one/many: callables returning synthetic_throughput's dict for 1 worker and for n workers (engines or scripts):
    notebook 04 measures on its engines, `kit.bench mnist` through horovodrun/mpirun; the arithmetic is this.
    """
    rows = []
    for _ in range(repeats):
        r1, rn = one(), many()
        rows.append({"thr_1": r1["samples_per_s"], "thr_n": rn["samples_per_s"],
                     "busy_1": r1["cores_busy"], "busy_n": rn["cores_busy"]})
    speedups = [r["thr_n"] / r["thr_1"] for r in rows]
    return {"n": n, "runs": rows,
            "median_thr_1": float(np.median([r["thr_1"] for r in rows])),
            "median_thr_n": float(np.median([r["thr_n"] for r in rows])),
            "speedup": float(np.median(speedups)), "efficiency": float(np.median(speedups)) / n}


def _setting_rows(result: dict):
    """Yield, per throughput setting of a bench result: key, pairs, 1-worker and 2-worker samples/s (min, max),
    the paired run's dict, and the median cores busy of 1 and of 2 workers (summed over workers)."""
    for key, t in result["throughput"].items():
        one, two = [r["thr_1"] for r in t["runs"]], [r["thr_n"] for r in t["runs"]]
        busy = [float(np.median([sum(r[k]) for r in t["runs"]])) for k in ("busy_1", "busy_n")]
        yield key, len(t["runs"]), (min(one), max(one)), (min(two), max(two)), t, busy


NAMES = {"tf_defaults": "intra-op 1, TF's inter-op pool", "pinned": "1 thread + pinned core (Gloo)",
         "pinned_mpi": "1 thread + pinned core (MPI)", "pinned_mpi_busy_poll": "same, MPI busy-polling"}


def explain_threads(result: dict) -> str:
    """Return the benchmark's throughput table as text: per setting, 1 vs 2 workers, speed-up, cores busy."""
    lines = [f"{'setting':31s} {'pairs':>5s} {'1 worker':>13s} {'2 workers':>13s} {'speed-up':>8s} "
             f"{'cores busy 1w | 2w':>19s}"]
    for key, pairs, one, two, t, busy in _setting_rows(result):
        lines.append(f"{NAMES.get(key, key):31s} {pairs:5d} {one[0]:6,.0f}-{one[1]:<6,.0f} "
                     f"{two[0]:6,.0f}-{two[1]:<6,.0f} {t['speedup']:7.2f}x {busy[0]:9.2f} | {busy[1]:.2f}")
    lines.append("(samples/s as min-max over the pairs; speed-up = median of the paired ratios; cores busy = CPU "
                 "time / wall time, median, summed over workers)")
    return "\n".join(lines)


def gain_check(name: str, runs: list[dict], speedup: float) -> Check:
    """Return whether N workers' paired `speedup` (median of thr_n / thr_1 over `runs`) lies beyond the noise band
    of one worker's own runs, (max - min) / median of their thr_1: within it, the pairs show no gain or loss."""
    one = [r["thr_1"] for r in runs]
    band = (max(one) - min(one)) / float(np.median(one))
    return Check(name, round(speedup, 2), f"> {1 + band:.2f} (1 + noise)", speedup > 1 + band, unit="×")


def gain_checks(result: dict) -> list[Check]:
    """Return gain_check for every thread setting of a `python -m kit.bench mnist` run."""
    return [gain_check(f"{NAMES.get(key, key)}: speed-up beyond noise", t["runs"], t["speedup"])
            for key, t in result["throughput"].items()]


def model_check(thr_n: float, predicted: float, tol: float = 0.10) -> Check:
    """Return whether N workers' samples/s reached the no-overlap model's `predicted` (less `tol`): overlap can
    only make the job faster than a step that waits for all of its exchange."""
    return Check("N workers vs the no-overlap model", round(thr_n), f"≥ {predicted * (1 - tol):,.0f}",
                 thr_n >= predicted * (1 - tol), unit=" samples/s")


def readme_table(result: dict) -> str:
    """Return the README's throughput table of a `python -m kit.bench mnist` run (checked by test_packaging)."""
    names = {"tf_defaults": "intra-op 1, TF's inter-op pool", "pinned": "1 thread + pinned core, Gloo",
             "pinned_mpi": "1 thread + pinned core, MPI (yield when idle)",
             "pinned_mpi_busy_poll": "1 thread + pinned core, MPI busy-polling"}
    out = ["| per worker | pairs | 1 worker | 2 workers | speed-up | cores busy 1w / 2w |", "|---|---|---|---|---|---|"]
    for key, pairs, one, two, t, busy in _setting_rows(result):
        out.append(f"| {names.get(key, key)} | {pairs} | {one[0]:,.0f}–{one[1]:,.0f} | {two[0]:,.0f}–{two[1]:,.0f} | "
                   f"{t['speedup']:.2f}× ({t['efficiency']:.0%}) | {busy[0]:.2f} / {busy[1]:.2f} |")
    return "\n".join(out)
