"""Horovod + Keras MNIST (notebook 04): the model and its data (model), TensorFlow imported quietly (tfimport), Keras
callbacks (callbacks), synthetic throughput (throughput), the training script (`python -m kit.mnist.train`) run as a
job (script), checkpoints (checkpoint), Horovod's timeline (timeline), the accuracy lesson and the linear scaling
rule and their checks (accuracy), elastic training (elastic) and the lab runs (lab). The names
below are those notebooks 04 and 04a, the training script and the docs use; each is defined in the module named
beside it."""
from kit.mnist.model import (
    BATCH, EPOCHS, BASE_LR, WARMUP_EPOCHS, DECAY, SCHEDULE, build_model, prepare, subset, shard, steps_per_epoch,
    decay_start, weights_digest)
from kit.mnist.tfimport import import_tf_quietly
from kit.mnist.callbacks import epoch_log
from kit.mnist.throughput import (
    engine_throughput, synthetic_throughput, paired_runs, explain_threads, readme_table, gain_check, gain_checks,
    model_check)
from kit.mnist.torch_cnn import torch_model
from kit.mnist.script import REPO, TRAIN, TRAIN_FILE, launch_env, paired_throughput
from kit.mnist.checkpoint import (
    CKPT_RE, CheckpointError, check_writable, checkpoint_callback, latest_good_checkpoint, list_checkpoints, resume,
    save_checkpoint)
from kit.mnist.timeline import allreduce_seconds_per_step, overlap_check, read_timeline
from kit.mnist.accuracy import accuracy_spread, accuracy_table, bench_checks, run_checks, scaling_checks
from kit.env import pin_to_core            # its home is kit.env; notebooks 04 and 04a call mnist.pin_to_core
from kit.plots.data import plot_throughput, plot_timeline   # notebook 04a draws them as mnist.plot_*
from kit import _lazy_submodules

__getattr__, __dir__ = _lazy_submodules(__name__, __path__, globals())
