"""Horovod + Keras MNIST (notebook 04): model, data and jobs (model; its names are this package's), the training
script (`python -m kit.mnist.train`), checkpoints, Horovod's timeline, elastic training and the lab runs (lab)."""
from kit.mnist.model import (
    CKPT_RE, CheckpointError, check_writable, checkpoint_callback, latest_good_checkpoint, list_checkpoints,
    load_checkpoint, optimizer_variables, restore, resume, save_checkpoint, pin_to_core, MPI_ENV, plot_history,
    plot_throughput, plot_timeline, allreduce_seconds_per_step, read_timeline, timeline_summary, BATCH, EPOCHS,
    BASE_LR, WARMUP_EPOCHS, DECAY, SCHEDULE, decay_start, SYNTHETIC_WARMUP, REPO, TRAIN,
    TRAIN_FILE, launch_env, import_tf_quietly, keras, build_model,
    prepare, subset, shard, steps_per_epoch, SUBSET, SEEDS, weights_digest, epoch_log,
    throughput_callback, engine_throughput,
    synthetic_throughput, torch_model, SETTINGS, run_script, paired_runs, paired_throughput, explain_threads,
    readme_table)
from kit.mnist.accuracy import accuracy_spread, accuracy_lesson, accuracy_table, accuracy_claim, batch_control
from kit import _lazy_submodules

__getattr__, __dir__ = _lazy_submodules(__name__, __path__, globals())
