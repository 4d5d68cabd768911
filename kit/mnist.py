"""Horovod + Keras MNIST (notebook 04 and scripts/train_keras_mnist.py): the shared pieces of the training.

    model = kit.mnist.build_model()                     # the classic Keras MNIST CNN
    x, y = kit.mnist.shard(x, y, hvd.rank(), hvd.size()) # Horovod: each rank trains on its 1/size of the data
    epoch0 = kit.mnist.resume(model, ckpt_dir, hvd)      # rank 0's last good checkpoint, broadcast to all ranks
    callbacks += [kit.mnist.checkpoint_callback(ckpt_dir), kit.mnist.epoch_log(n)]  # Horovod: on rank 0 only

The six Horovod steps themselves stay in the notebook and in the script, where they can be read.
"""
from __future__ import annotations

import glob
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")   # Horovod's Keras needs tf-keras (Keras 2), set before TF
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

BATCH = 128             # the classic example's batch size (per worker)
BASE_EPOCHS = 12        # the classic example trains 12 epochs on one GPU
BASE_LR = 1.0           # Adadelta's learning rate in the classic Keras example
WARMUP_EPOCHS = 3       # gradual warmup from lr to lr * size (Goyal et al.; Horovod's Keras example uses 3)
REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "train_keras_mnist.py"


def launch_env(**extra) -> dict:
    """Return the environment for horovodrun/mpirun children: the venv's bin on PATH; Open MPI allowed as root."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", TF_USE_LEGACY_KERAS="1",
               PYTHONUNBUFFERED="1")
    env.update({k: str(v) for k, v in extra.items()})
    return env


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
    """Return rank's 1/size of the data (every size-th example from `rank`), equal-length on every rank."""
    n = len(x) // size * size        # equal lengths: ranks must run the same number of steps (allreduce!)
    return x[rank:n:size], y[rank:n:size]


def epochs_for(size: int, base: int = BASE_EPOCHS) -> int:
    """Return ceil(base / size): with size workers each epoch does size times the work of one."""
    return math.ceil(base / size)


def time_epoch(model, x, y, tries: int = 2) -> float:
    """Return the best of `tries` epoch times (s) of model.fit on (x, y), from the steps' pace (start-up excluded)."""
    ends = []
    tick = keras().callbacks.LambdaCallback(on_train_batch_end=lambda step, logs: ends.append(time.perf_counter()))
    best = float("inf")
    for _ in range(tries):
        ends.clear()
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[tick])
        best = min(best, (ends[-1] - ends[0]) * len(ends) / (len(ends) - 1))
    return best


def weights_digest(model) -> str:
    """Return a short hash of every weight of `model` (equal on all ranks iff the replicas are identical)."""
    import hashlib
    h = hashlib.sha256()
    for w in model.get_weights():
        h.update(np.ascontiguousarray(w).tobytes())
    return h.hexdigest()[:16]


# ----------------------------------------------------------------------------------- checkpoints
CKPT_RE = re.compile(r"ckpt-epoch-(\d+)\.npz$")


def optimizer_variables(opt) -> list:
    """Return the optimizer's state variables (iteration count and slots), for either Keras optimizer API."""
    v = opt.variables
    return list(v() if callable(v) else v)


def save_checkpoint(ckpt_dir, epoch: int, model, keep: int = 3) -> Path:
    """Write weights + optimizer state after `epoch` epochs atomically (temp file + rename); keep the last few."""
    d = Path(ckpt_dir)
    d.mkdir(parents=True, exist_ok=True)
    arrays = {f"w{i}": w for i, w in enumerate(model.get_weights())}
    arrays.update({f"o{i}": v.numpy() for i, v in enumerate(optimizer_variables(model.optimizer))})
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=".npz")
    with os.fdopen(fd, "wb") as f:
        np.savez(f, epoch=epoch, **arrays)
        f.flush()
        os.fsync(f.fileno())
    path = d / f"ckpt-epoch-{epoch:04d}.npz"
    os.replace(tmp, path)            # atomic: a reader sees the old file or the whole new one, never half
    for old in list_checkpoints(d)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def list_checkpoints(ckpt_dir) -> list[Path]:
    """Return the checkpoint files in ckpt_dir, oldest first."""
    files = [Path(p) for p in glob.glob(str(Path(ckpt_dir) / "ckpt-epoch-*.npz"))]
    return sorted((p for p in files if CKPT_RE.search(p.name)), key=lambda p: int(CKPT_RE.search(p.name)[1]))


def load_checkpoint(path) -> dict:
    """Read one checkpoint into {'epoch', 'weights', 'optimizer'}; raise ValueError if it is unreadable."""
    try:
        with np.load(path, allow_pickle=False) as f:
            keys = set(f.files)
            nw = sum(1 for k in keys if k.startswith("w"))
            no = sum(1 for k in keys if k.startswith("o"))
            return {"epoch": int(f["epoch"]), "weights": [f[f"w{i}"] for i in range(nw)],
                    "optimizer": [f[f"o{i}"] for i in range(no)]}
    except Exception as e:
        raise ValueError(f"{path}: unreadable checkpoint ({type(e).__name__}: {e})") from None


def latest_good_checkpoint(ckpt_dir, model=None) -> dict | None:
    """Return the newest checkpoint that loads (and fits `model`); warn about and skip corrupt ones."""
    shapes = [w.shape for w in model.get_weights()] if model is not None else None
    for path in reversed(list_checkpoints(ckpt_dir)):
        try:
            state = load_checkpoint(path)
            if shapes is not None and [w.shape for w in state["weights"]] != shapes:
                raise ValueError(f"{path}: weights do not fit this model")
        except ValueError as e:
            print(f"WARNING: ignoring corrupt checkpoint {e}; trying the previous one", file=sys.stderr, flush=True)
            continue
        state["path"] = str(path)
        return state
    return None


def restore(model, state: dict):
    """Set the model's weights and its optimizer's state from a checkpoint dict."""
    model.set_weights(state["weights"])
    opt = model.optimizer
    if not optimizer_variables(opt) or len(optimizer_variables(opt)) < len(state["optimizer"]):
        opt.build(model.trainable_variables)          # create the slots before filling them
    for var, value in zip(optimizer_variables(opt), state["optimizer"]):
        var.assign(value)


def resume(model, ckpt_dir, hvd) -> int:
    """Load rank 0's newest good checkpoint, broadcast it to every rank, restore it; return epochs done (0 if none)."""
    state = latest_good_checkpoint(ckpt_dir, model) if (ckpt_dir and hvd.rank() == 0) else None
    # Horovod: only rank 0 reads the disk (other machines may not see it); everyone gets rank 0's state.
    from horovod.tensorflow import broadcast_object
    state = broadcast_object(state, root_rank=0, name="kit.mnist.resume")
    if state is None:
        return 0
    restore(model, state)
    if hvd.rank() == 0:
        print(f"resumed from epoch {state['epoch']} ({Path(state['path']).name})", flush=True)
    return state["epoch"]


def checkpoint_callback(ckpt_dir, keep: int = 3):
    """Return a Keras callback that saves an atomic checkpoint at the end of every epoch (use on rank 0 only)."""
    class CheckpointCallback(keras().callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            save_checkpoint(ckpt_dir, epoch + 1, self.model, keep)
    return CheckpointCallback()


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


# ----------------------------------------------------------------------------------- thread placement
def local_rank_from_env() -> int:
    """Return this process's local rank as the launcher set it (horovodrun, mpirun, kit.cluster); 0 if none."""
    for var in ("HOROVOD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "KIT_LOCAL_RANK", "PMI_LOCAL_RANK"):
        if os.environ.get(var):
            return int(os.environ[var])
    return 0


def pin_to_core(local_rank: int) -> int:
    """Pin every thread of this process (and threads it starts later) to one core chosen by local rank."""
    from .sysinfo import pin_threads
    cores = sorted(os.sched_getaffinity(0))
    core = cores[local_rank % len(cores)]
    pin_threads({core})
    return core


# ----------------------------------------------------------------------------------- throughput
def engine_throughput(steps: int = 60, distributed: bool = True) -> dict:
    """Run synthetic_throughput on an engine: with Horovod (every rank must call it) or as one plain process."""
    import horovod.tensorflow.keras as hvd
    return synthetic_throughput(hvd if distributed else None, steps=steps)


def synthetic_throughput(hvd=None, steps: int = 60, warmup: int = 10, batch: int = BATCH) -> dict:
    """Train the CNN on random data for warmup + steps batches per rank; return the job's samples/s.

    hvd=None: one plain Keras process (the baseline); else every rank of the Horovod job must call it.
    """
    import tensorflow as tf
    rank, size = (hvd.rank(), hvd.size()) if hvd else (0, 1)
    rng = np.random.default_rng(rank)
    n = (warmup + steps) * batch
    x, y = rng.random((n, 28, 28, 1), dtype=np.float32), rng.integers(0, 10, n)
    model = build_model()
    opt = tf.keras.optimizers.Adadelta(BASE_LR * size)
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


# ----------------------------------------------------------------------------------- Horovod timeline
def read_timeline(path) -> list[dict]:
    """Parse a HOROVOD_TIMELINE file into intervals {tensor, phase, depth, start, end} (seconds, from 0)."""
    text = Path(path).read_text().strip()
    if not text.endswith("]"):                      # Horovod leaves the list open while the job runs
        text = text.rstrip(",") + "]"
    events = json.loads(text)
    names, stacks, out = {}, {}, []
    for ev in events:
        pid = ev.get("pid")
        if ev.get("ph") == "M" and ev.get("name") == "process_name" and "name" in ev.get("args", {}):
            names[pid] = ev["args"]["name"]
        elif ev.get("ph") == "B":
            stacks.setdefault(pid, []).append((ev["name"], ev["ts"]))
        elif ev.get("ph") == "E" and stacks.get(pid):
            phase, start = stacks[pid].pop()
            out.append({"tensor": short_tensor_name(names.get(pid, str(pid))), "phase": phase,
                        "depth": len(stacks[pid]), "start": start / 1e6, "end": ev["ts"] / 1e6})
    t0 = min((r["start"] for r in out), default=0.0)
    for r in out:
        r["start"], r["end"] = r["start"] - t0, r["end"] - t0
    return sorted(out, key=lambda r: (r["start"], r["depth"]))


def short_tensor_name(name: str) -> str:
    """Shorten TF's long op name to what it is, e.g. '...HorovodAllreduce_grads_6_0' -> 'grads_6'."""
    m = re.search(r"Horovod\w*?_(grads?_?\d*)(?:_\d+)?$", name)
    return m[1] if m else name.rsplit("/", 1)[-1][-24:]


def timeline_summary(intervals: list[dict]) -> dict[str, float]:
    """Return the total seconds spent in each phase, summed over tensors."""
    out: dict[str, float] = {}
    for r in intervals:
        out[r["phase"]] = out.get(r["phase"], 0.0) + r["end"] - r["start"]
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def allreduce_seconds_per_step(intervals: list[dict]) -> float:
    """Return the data-exchange time per training step: distinct (fused) allreduces, divided by the steps seen."""
    ops = {(round(r["start"], 6), round(r["end"], 6)) for r in intervals if r["phase"].endswith("_ALLREDUCE")
           and not r["phase"].startswith("NEGOTIATE") and r["tensor"].startswith("grads")}
    steps = sum(1 for r in intervals if r["phase"] == "ALLREDUCE" and r["tensor"] == "grads_0")
    return sum(end - start for start, end in ops) / max(steps, 1)


def plot_timeline(intervals: list[dict], start: float = 0.0, seconds: float | None = None, ax=None):
    """Draw the allreduce phases per tensor as a Gantt chart (one row per tensor, colour = phase)."""
    import matplotlib.pyplot as plt
    end = start + seconds if seconds else float("inf")
    rows = [r for r in intervals if r["end"] >= start and r["start"] <= end and r["tensor"].startswith("grad")]
    tensors = sorted({r["tensor"] for r in rows}, key=lambda t: [int(d) for d in re.findall(r"\d+", t)] or [0])
    phases = sorted({r["phase"] for r in rows}, key=lambda p: (p.startswith("NEGOTIATE") is False, p))
    colours = dict(zip(phases, plt.get_cmap("tab10").colors))
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 0.35 * len(tensors) + 1.5))
    for r in rows:
        y, h = tensors.index(r["tensor"]), 0.8 if r["depth"] == 0 else 0.4
        ax.broken_barh([(1e3 * r["start"], 1e3 * (r["end"] - r["start"]))], (y - h / 2, h),
                       color=colours[r["phase"]], label=r["phase"])
    handles = {h.get_label(): h for h in ax.collections}
    ax.legend(handles.values(), handles.keys(), fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_yticks(range(len(tensors)), tensors)
    ax.set_xlabel("time (ms)")
    ax.set_title("Horovod timeline: allreduce phases per gradient tensor (rank 0's view)")
    return ax


# ----------------------------------------------------------------------------------- plots
def plot_history(history: list[dict], title: str = ""):
    """Plot loss and accuracy (train and test) per epoch."""
    import matplotlib.pyplot as plt
    epochs = [h["epoch"] for h in history]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.2))
    a.plot(epochs, [h["loss"] for h in history], "o-", label="train")
    a.plot(epochs, [h["val_loss"] for h in history], "s--", label="test")
    b.plot(epochs, [h["accuracy"] for h in history], "o-", label="train")
    b.plot(epochs, [h["val_accuracy"] for h in history], "s--", label="test")
    for ax, name in ((a, "loss"), (b, "accuracy")):
        ax.set_xlabel("epoch")
        ax.set_ylabel(name)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_throughput(runs: dict[str, list[float]], ax=None):
    """Plot samples/s per repeat for each setting (e.g. {'1 worker': [...], '2 workers': [...]})."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.2))
    for i, (name, values) in enumerate(runs.items()):
        ax.scatter([i] * len(values), values, alpha=0.7)
        ax.hlines(np.median(values), i - 0.25, i + 0.25, color="k")
    ax.set_xticks(range(len(runs)), list(runs))
    ax.set_ylabel("samples/s (whole job)")
    ax.set_ylim(0, None)
    ax.set_title("throughput per run (bar = median)")
    return ax


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
    """Run scripts/train_keras_mnist.py on n local workers (horovodrun --gloo or mpirun); return rank 0's JSON."""
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "result.json"
        bin_ = Path(sys.executable).parent
        if launcher == "gloo":
            cmd = [str(bin_ / "horovodrun"), "--gloo", "-np", str(n), "-H", f"localhost:{n}"]
        else:
            cmd = [str(bin_ / "mpirun"), "--oversubscribe", "-np", str(n)]
        cmd += [sys.executable, str(SCRIPT), *args, "--json", str(out)]
        p = subprocess.run(cmd, env=launch_env(**(env or {})), capture_output=True, text=True, timeout=timeout,
                           cwd=REPO)
        if p.returncode or not out.exists():
            raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
        return json.loads(out.read_text())


def paired_throughput(args: list[str], repeats: int, steps: int, n: int = 2, launcher: str = "gloo") -> dict:
    """Measure samples/s of 1 worker, then n workers, `repeats` times; return both lists and the paired speed-ups."""
    rows = []
    for _ in range(repeats):
        one = run_script(1, ["--synthetic-steps", str(steps), *args], launcher)
        many = run_script(n, ["--synthetic-steps", str(steps), *args], launcher)
        rows.append({"thr_1": one["samples_per_s"], "thr_n": many["samples_per_s"],
                     "busy_1": one["cores_busy"], "busy_n": many["cores_busy"]})
    speedups = [r["thr_n"] / r["thr_1"] for r in rows]
    return {"args": args, "launcher": launcher, "n": n, "steps": steps, "runs": rows,
            "median_thr_1": float(np.median([r["thr_1"] for r in rows])),
            "median_thr_n": float(np.median([r["thr_n"] for r in rows])),
            "speedup": float(np.median(speedups)), "efficiency": float(np.median(speedups)) / n}


def explain_threads(result: dict) -> str:
    """Return the benchmark's throughput table as text: per setting, 1 vs 2 workers, speed-up, cores busy."""
    names = {"tf_defaults": "intra-op 1, TF's inter-op pool", "pinned": "1 thread + pinned core (Gloo)",
             "pinned_mpi": "1 thread + pinned core (MPI)"}
    lines = [f"{'setting':31s} {'pairs':>5s} {'1 worker':>13s} {'2 workers':>13s} {'speed-up':>8s} "
             f"{'cores busy 1w | 2w':>19s}"]
    for key, t in result["throughput"].items():
        one, two = [r["thr_1"] for r in t["runs"]], [r["thr_n"] for r in t["runs"]]
        busy1 = np.median([sum(r["busy_1"]) for r in t["runs"]])
        busy2 = np.median([sum(r["busy_n"]) for r in t["runs"]])
        lines.append(f"{names.get(key, key):31s} {len(t['runs']):5d} {min(one):6,.0f}-{max(one):<6,.0f} "
                     f"{min(two):6,.0f}-{max(two):<6,.0f} {t['speedup']:7.2f}x {busy1:9.2f} | {busy2:.2f}")
    lines.append("(samples/s as min-max over the pairs; speed-up = median of the paired ratios; cores busy = CPU "
                 "time / wall time, median, summed over workers)")
    return "\n".join(lines)


def bench(out_dir: Path, quick: bool) -> tuple[dict, str]:
    """Measure 1- vs 2-worker throughput per thread setting, and 2-worker vs 1-process accuracy; plot both."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    repeats, steps = (2, 30) if quick else (5, 60)
    throughput = {name: paired_throughput(args, repeats, steps) for name, args in SETTINGS.items()}
    throughput["pinned_mpi"] = paired_throughput(SETTINGS["pinned"], max(2, repeats - 2), steps, launcher="mpi")
    timeline = Path(out_dir) / "mnist_timeline.json"
    run_script(2, ["--synthetic-steps", "20", *SETTINGS["pinned"]], env={"HOROVOD_TIMELINE": str(timeline)})
    data = ["--dataset", "digits", "--epochs", "6"] if quick else ["--dataset", "auto"]
    dist = run_script(2, [*data, *SETTINGS["pinned"]])
    single = run_script(1, [*data, "--epochs", str(dist["epochs"]), "--threads", "2"])
    result = {"dataset": dist["dataset"], "epochs": dist["epochs"], "throughput": throughput,
              "accuracy": {"2_workers": dist["test_accuracy"], "1_process": single["test_accuracy"]},
              "history": {"2_workers": dist["history"], "1_process": single["history"]},
              "replicas_identical": dist["replicas_identical"]}
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 3.8))
    runs = {}
    for key, t in throughput.items():
        runs[f"{key}\n1 worker"] = [r["thr_1"] for r in t["runs"]]
        runs[f"{key}\n2 workers"] = [r["thr_n"] for r in t["runs"]]
    plot_throughput(runs, ax=a)
    a.tick_params(axis="x", labelsize=7)
    for name, h in result["history"].items():
        b.plot([r["epoch"] for r in h], [r["val_accuracy"] for r in h], "o-", label=name.replace("_", " "))
    b.set_xlabel("epoch")
    b.set_ylabel(f"test accuracy ({dist['dataset']})")
    b.legend()
    fig.tight_layout()
    fig.savefig(Path(out_dir) / "mnist.png", dpi=110)
    intervals = read_timeline(timeline)
    end = max(r["end"] for r in intervals if r["tensor"].startswith("grads"))
    plt.close("all")
    plot_timeline(intervals, start=end - 0.3, seconds=0.3).figure.savefig(Path(out_dir) / "mnist_timeline.png",
                                                                        dpi=110, bbox_inches="tight")
    plt.close("all")
    timeline.unlink()
    p, d = throughput["pinned"], throughput["tf_defaults"]
    acc2, acc1 = dist["test_accuracy"], single["test_accuracy"]
    summary = (f"mnist: {dist['dataset']} test accuracy {acc2:.4f} with 2 workers vs {acc1:.4f} in 1 process "
               f"({dist['epochs']} epochs, diff {100 * (acc2 - acc1):+.2f} points); throughput 2 workers "
               f"{p['median_thr_n']:,.0f} vs 1 worker {p['median_thr_1']:,.0f} samples/s = {p['speedup']:.2f}x, "
               f"efficiency {p['efficiency']:.0%} (1 pinned thread per worker, median of {len(p['runs'])} pairs; "
               f"TF defaults: {d['speedup']:.2f}x)")
    return result, summary
