"""Keras callbacks of the MNIST jobs: one line per epoch, and the timed steps' samples/s."""
from __future__ import annotations

import time

from kit.mnist.tfimport import keras


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
