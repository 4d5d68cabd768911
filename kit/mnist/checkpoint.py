"""Atomic checkpoints of a Keras model and its optimizer; resume from rank 0's newest good one (notebook 04).

    callbacks.append(kit.mnist.checkpoint.checkpoint_callback(ckpt_dir))   # Horovod: on rank 0 only
    epoch0 = kit.mnist.checkpoint.resume(model, ckpt_dir, hvd)             # rank 0 reads, every rank receives
"""
from __future__ import annotations

import glob
import os
import re
import sys
import tempfile
from pathlib import Path

import numpy as np


def _keras():
    import tensorflow as tf
    return tf.keras


CKPT_RE = re.compile(r"ckpt-epoch-(\d+)\.npz$")


def optimizer_variables(opt) -> list:
    """Return the optimizer's state variables (iteration count and slots), for either Keras optimizer API."""
    v = opt.variables
    return list(v() if callable(v) else v)


class CheckpointError(OSError):
    """The checkpoint folder cannot be written; the message names it and what to do."""


def check_writable(ckpt_dir) -> Path:
    """Make `ckpt_dir` if needed and write a probe file there; raise CheckpointError if that fails.

    Called before training, so that a wrong folder costs seconds, not the first epoch."""
    d = Path(ckpt_dir)
    try:
        d.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=d, prefix=".probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise CheckpointError(f"checkpoint folder {d} cannot be written ({type(e).__name__}: {e.strerror or e}): "
                              "choose a folder you can write, e.g. one under your home directory") from None
    return d


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
    """Return a Keras callback that saves an atomic checkpoint at the end of every epoch (use on rank 0 only).

    Raises CheckpointError at once if `ckpt_dir` cannot be written."""
    check_writable(ckpt_dir)
    class CheckpointCallback(_keras().callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            save_checkpoint(ckpt_dir, epoch + 1, self.model, keep)
    return CheckpointCallback()
