"""Horovod + Keras MNIST (notebook 04 and kit.mnist.train): the shared pieces of the training.

    model = kit.mnist.build_model()                     # the classic Keras MNIST CNN
    x, y = kit.mnist.shard(x, y, hvd.rank(), hvd.size()) # Horovod: each rank trains on its 1/size of the data
    epoch0 = kit.mnist.resume(model, ckpt_dir, hvd)      # rank 0's last good checkpoint (kit.mnist.checkpoint)
    callbacks += [kit.mnist.checkpoint_callback(ckpt_dir), kit.mnist.epoch_log(n)]  # Horovod: on rank 0 only

The six Horovod steps themselves stay in the notebook and in the script, where they can be read.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from kit import env
from kit.mnist.checkpoint import (CKPT_RE, CheckpointError, check_writable, checkpoint_callback,  # noqa: F401
                         latest_good_checkpoint, list_checkpoints, load_checkpoint, optimizer_variables, restore,
                         resume, save_checkpoint)
from kit.env import pin_to_core  # noqa: F401  (kit.env is its home; notebook 04 calls mnist.pin_to_core)
from kit.env import MPI_ENV
from kit.plots.data import plot_history, plot_throughput, plot_timeline  # noqa: F401  (notebook 04: mnist.plot_*)
from kit.mnist.timeline import allreduce_seconds_per_step, read_timeline, timeline_summary  # noqa: F401  (notebook 04)

BATCH = 128             # the classic example's batch size (per worker)
EPOCHS = 12             # the classic example trains 12 epochs; sharded, N workers keep the 12 (see shard)
BASE_LR = 0.001         # Adam's rate in Horovod's TF2 Keras MNIST example (the article's older one: Adadelta, 1.0)
WARMUP_EPOCHS = 3       # gradual warmup from lr to lr * size (Goyal et al.; Horovod's Keras example uses 3)
DECAY = 0.1             # step decay: the last quarter of the epochs at 0.1 x the rate (see decay_start)
SCHEDULE = f"Adam at {BASE_LR} x N, warmup {WARMUP_EPOCHS} epochs, x{DECAY} for the last quarter"  # results/mnist.json
SUBSET = (6_000, 2_000)  # train / test images of notebook 04's default run, and of `kit.bench mnist`'s accuracy runs
SEEDS = (0, 1, 2, 3, 4)  # `kit.bench mnist`: accuracy runs per arm (2 workers, 1 process, the control): the spread
SYNTHETIC_WARMUP = 10   # steps synthetic_throughput runs before it starts timing (graph building, first sync)
REPO = Path(__file__).resolve().parents[2]   # the folder that holds the `kit` package: the jobs' working directory
TRAIN = ("-m", "kit.mnist.train")   # the training script, as `python -m kit.mnist.train`
TRAIN_FILE = Path(__file__).with_name("train.py")   # its source (notebook 04 prints a part of it)


def launch_env(**extra) -> dict:
    """Return the environment for horovodrun/mpirun children: the venv's bin on PATH; Open MPI allowed as root."""
    out = {**os.environ, **env.FRAMEWORK_ENV, **MPI_ENV, "PYTHONUNBUFFERED": "1",
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    out.update({k: str(v) for k, v in extra.items()})
    return out


def import_tf_quietly():
    """Import TensorFlow and list its devices with the C++ start-up log lines (fd 2) silenced; return tf."""
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        import tensorflow as tf
        tf.config.list_physical_devices()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
    return tf


def keras():
    """Return tf.keras (the Keras 2 API that Horovod supports)."""
    import tensorflow as tf
    return tf.keras


# ----------------------------------------------------------------------------------- model and data
def build_model():
    """Return the classic Keras MNIST CNN (uncompiled)."""
    L = keras().layers
    return keras().Sequential([
        keras().Input((28, 28, 1)),
        L.Conv2D(32, 3, activation="relu"), L.Conv2D(64, 3, activation="relu"), L.MaxPooling2D(2),
        L.Dropout(0.25), L.Flatten(), L.Dense(128, activation="relu"), L.Dropout(0.5),
        L.Dense(10, activation="softmax")])


def prepare(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Scale uint8 (N, 28, 28) images to float32 (N, 28, 28, 1) in [0, 1]; labels to int64."""
    return (x.astype(np.float32) / 255.0)[..., None], y.astype(np.int64)


def subset(x: np.ndarray, y: np.ndarray, n: int | None, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Return n examples drawn without replacement (all of them if n is None or too big)."""
    if n is None or n >= len(x):
        return x, y
    idx = np.random.default_rng(seed).permutation(len(x))[:n]
    return x[idx], y[idx]


def shard(x: np.ndarray, y: np.ndarray, rank: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Return rank's 1/size of the data (every size-th example from `rank`), equal-length on every rank.

    The kit's convention (Horovod's tensorflow2_keras_mnist.py: steps_per_epoch // size): an epoch is one pass
    over the data shared by the ranks, so N workers run the same epochs as one process, each epoch in 1/N of
    the steps (of an N-times larger global batch). The other convention (Horovod's keras_mnist.py: every rank
    sees all data, ceil(12 / N) epochs) gives the same samples in total; doing both would train 1/N of them.
    """
    n = len(x) // size * size        # equal lengths: ranks must run the same number of steps (allreduce!)
    return x[rank:n:size], y[rank:n:size]


def steps_per_epoch(n_samples: int, size: int, batch: int = BATCH) -> int:
    """Return each rank's optimizer steps per epoch when n_samples are sharded over size ranks (batch per rank),
    as Keras' fit counts them: the last, partial batch of the shard is a step too (ceil)."""
    return -(-(n_samples // size) // batch)


def decay_start(epochs: int) -> int:
    """Return the first epoch (0-based) trained at DECAY x the learning rate: the last quarter of `epochs`.

    Goyal et al.'s recipe ends with the rate divided by 10, as ResNet's schedule does; without it this short run
    ends at the full (for N workers, N-times) rate, and its test accuracy still jumps from epoch to epoch."""
    return epochs - epochs // 4


def weights_digest(model) -> str:
    """Return a short hash of every weight of `model` (equal on all ranks iff the replicas are identical)."""
    import hashlib
    h = hashlib.sha256()
    for w in model.get_weights():
        h.update(np.ascontiguousarray(w).tobytes())
    return h.hexdigest()[:16]


# ----------------------------------------------------------------------------------- progress and speed
def epoch_log(samples_per_epoch: int, history: list | None = None):
    """Return a Keras callback printing one line per epoch (loss, accuracy, samples/s), flushed at once."""
    class EpochLog(keras().callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.t0 = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            dt = time.perf_counter() - self.t0
            row = {"epoch": epoch + 1, **{k: float(v) for k, v in (logs or {}).items()}, "seconds": dt,
                   "samples_per_s": samples_per_epoch / dt}
            if history is not None:
                history.append(row)
            val = f"  val_acc {row['val_accuracy']:.4f}" if "val_accuracy" in row else ""
            print(f"epoch {epoch + 1:2d}/{self.params['epochs']}  loss {row['loss']:.4f}  "
                  f"acc {row['accuracy']:.4f}{val}  {dt:5.1f} s  {row['samples_per_s']:,.0f} samples/s", flush=True)
    return EpochLog()


def throughput_callback(warmup: int, batch: int, size: int, out: dict):
    """Return a Keras callback that times the steps after `warmup` and puts samples/s (all ranks) in `out`."""
    class Throughput(keras().callbacks.Callback):
        def on_train_batch_end(self, step, logs=None):
            if step + 1 == warmup:
                self.t0, self.c0, self.n0 = time.perf_counter(), time.process_time(), step + 1
            self.t1, self.c1, self.n1 = time.perf_counter(), time.process_time(), step + 1

        def on_train_end(self, logs=None):
            out["samples_per_s"] = (self.n1 - self.n0) * batch * size / (self.t1 - self.t0)
            out["cores_busy"] = (self.c1 - self.c0) / (self.t1 - self.t0)   # CPU time / wall time, this rank
    return Throughput()


# ----------------------------------------------------------------------------------- throughput
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


# ----------------------------------------------------------------------------------- the same in PyTorch
def torch_model():
    """Return the classic MNIST CNN in PyTorch (same layers as build_model)."""
    import torch.nn as nn
    return nn.Sequential(
        nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Dropout(0.25),
        nn.Flatten(), nn.Linear(9216, 128), nn.ReLU(), nn.Dropout(0.5), nn.Linear(128, 10))


# ----------------------------------------------------------------------------------- the benchmark
SETTINGS = {   # what each worker gets; "one compute thread per worker" needs more than intra-op = 1
    "tf_defaults": ["--threads", "1"],                                         # TF's inter-op pool, no pinning
    "pinned": ["--threads", "1", "--inter-op-threads", "1", "--pin"],          # 1 thread, 1 core per worker
}


def run_script(n: int, args: list[str], launcher: str = "gloo", env: dict | None = None, timeout: float = 1800):
    """Run kit.mnist.train on n local workers (horovodrun --gloo or mpirun); return rank 0's JSON."""
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "result.json"
        bin_ = Path(sys.executable).parent
        if launcher == "gloo":
            cmd = [str(bin_ / "horovodrun"), "--gloo", "-np", str(n), "-H", f"localhost:{n}"]
        else:
            cmd = [str(bin_ / "mpirun"), "--oversubscribe", "-np", str(n)]
        cmd += [sys.executable, *TRAIN, *args, "--json", str(out)]
        p = subprocess.run(cmd, env=launch_env(**(env or {})), capture_output=True, text=True, timeout=timeout,
                           cwd=REPO)
        if p.returncode or not out.exists():
            raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
        return json.loads(out.read_text())


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


def paired_throughput(args: list[str], repeats: int, steps: int, n: int = 2, launcher: str = "gloo",
                      env: dict | None = None) -> dict:
    """paired_runs of kit.mnist.train: 1 worker, then n workers under `launcher` (with `env`)."""
    synthetic = ["--synthetic-steps", str(steps), *args]
    out = paired_runs(lambda: run_script(1, synthetic, launcher, env), lambda: run_script(n, synthetic, launcher, env),
                      repeats, n)
    return {"args": args, "launcher": launcher, "env": env or {}, "steps": steps, **out}


def _setting_rows(result: dict):
    """Yield, per throughput setting of a bench result: key, pairs, 1-worker and 2-worker samples/s (min, max),
    the paired run's dict, and the median cores busy of 1 and of 2 workers (summed over workers)."""
    for key, t in result["throughput"].items():
        one, two = [r["thr_1"] for r in t["runs"]], [r["thr_n"] for r in t["runs"]]
        busy = [float(np.median([sum(r[k]) for r in t["runs"]])) for k in ("busy_1", "busy_n")]
        yield key, len(t["runs"]), (min(one), max(one)), (min(two), max(two)), t, busy


def explain_threads(result: dict) -> str:
    """Return the benchmark's throughput table as text: per setting, 1 vs 2 workers, speed-up, cores busy."""
    names = {"tf_defaults": "intra-op 1, TF's inter-op pool", "pinned": "1 thread + pinned core (Gloo)",
             "pinned_mpi": "1 thread + pinned core (MPI)", "pinned_mpi_busy_poll": "same, MPI busy-polling"}
    lines = [f"{'setting':31s} {'pairs':>5s} {'1 worker':>13s} {'2 workers':>13s} {'speed-up':>8s} "
             f"{'cores busy 1w | 2w':>19s}"]
    for key, pairs, one, two, t, busy in _setting_rows(result):
        lines.append(f"{names.get(key, key):31s} {pairs:5d} {one[0]:6,.0f}-{one[1]:<6,.0f} "
                     f"{two[0]:6,.0f}-{two[1]:<6,.0f} {t['speedup']:7.2f}x {busy[0]:9.2f} | {busy[1]:.2f}")
    lines.append("(samples/s as min-max over the pairs; speed-up = median of the paired ratios; cores busy = CPU "
                 "time / wall time, median, summed over workers)")
    return "\n".join(lines)


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
