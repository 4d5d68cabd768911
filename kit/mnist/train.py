"""Train the classic Keras MNIST CNN with Horovod: the notebook 04 code as a script.

    horovodrun --gloo -np 2 -H localhost:2 python -m kit.mnist.train --epochs 2
    mpirun -np 2 python -m kit.mnist.train --dataset digits
    horovodrun --gloo -np 2 --min-np 1 --max-np 2 --host-discovery-script ./hosts.sh \
        python -m kit.mnist.train --elastic       # survives a lost host, takes it back (kit.mnist.elastic)
    horovodrun -np 16 -H server1:4,server2:4,server3:4,server4:4 python -m kit.mnist.train

Lines marked `# Horovod:` are the whole difference from single-process Keras. Kill it and start it again with the
same --checkpoint-dir: it resumes from rank 0's last good checkpoint.
"""
import argparse
import atexit
import json
import math
import os
import tempfile
from pathlib import Path

# Importing kit (this module's package) set TF_USE_LEGACY_KERAS=1 before TensorFlow: Horovod's Keras is tf-keras.
from kit import scratch


SEED_MAX = 2**32 - 1 - 4096      # TensorFlow's seeds are 32-bit; each rank (up to 4096 of them) adds its rank


def parse_args(argv=None):
    """Parse and check the command line (a clear message and exit status 2 for a bad value, before TF starts)."""
    p = argparse.ArgumentParser(prog="python -m kit.mnist.train", description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=None, help="default: 12, whatever the number of workers")
    p.add_argument("--dataset", default="auto", choices=["auto", "mnist", "fashion_mnist", "digits"])
    p.add_argument("--checkpoint-dir", default=None, help="rank 0 saves here each epoch; resumes from here")
    p.add_argument("--batch-size", type=int, default=128, help="per worker (the classic example's 128)")
    p.add_argument("--train-samples", type=int, default=None, help="use a random subset (default: all)")
    p.add_argument("--test-samples", type=int, default=None, help="test on a random subset (default: all)")
    p.add_argument("--seed", type=int, default=None,
                   help="seed the initial weights and the shuffling (default: a different run each time)")
    p.add_argument("--warmup-epochs", type=float, default=None, help="learning-rate warmup (Goyal et al.; default 3)")
    p.add_argument("--as-workers", type=int, default=None,
                   help="one process trained as N workers are: N x the batch, N x the rate, their warmup (the "
                        "large-batch control: is a gap to N workers the batch's, or the distribution's?)")
    p.add_argument("--threads", type=int, default=None, help="TF intra-op threads per worker")
    p.add_argument("--inter-op-threads", type=int, default=None, help="TF inter-op threads per worker")
    p.add_argument("--pin", action="store_true", help="pin each worker's threads to one core (by local rank)")
    p.add_argument("--pin-by-rank", action="store_true",
                   help="pin by global rank instead: for emulated hosts (kit.netlab) that share one machine's cores")
    p.add_argument("--synthetic-steps", type=int, default=0,
                   help="measure samples/s on random data for this many steps instead of training")
    p.add_argument("--json", default=None, help="rank 0 writes the history / throughput here")
    p.add_argument("--elastic", action="store_true",
                   help="elastic Horovod: run by horovodrun --min-np/--max-np/--host-discovery-script")
    p.add_argument("--commit-every", type=int, default=10, help="(elastic) commit the state every K batches")
    p.add_argument("--events", default=None, help="(elastic) rank 0 appends one JSON line per event here")
    p.add_argument("--init-timeout", type=float, default=600,
                   help="seconds hvd.init() may take before this rank ends the job with an error (0: wait forever)")
    args = p.parse_args(argv)
    for name, low in (("epochs", 1), ("batch_size", 1), ("train_samples", 1), ("test_samples", 1), ("threads", 1),
                      ("inter_op_threads", 1), ("as_workers", 1), ("commit_every", 1), ("synthetic_steps", 0)):
        value = getattr(args, name)
        if value is not None and value < low:       # checked here, before TensorFlow starts
            p.error(f"--{name.replace('_', '-')} must be at least {low} (got {value})")
    for name in ("warmup_epochs", "init_timeout"):
        value = getattr(args, name)
        if value is not None and not (math.isfinite(value) and value >= 0):
            p.error(f"--{name.replace('_', '-')} must be a finite number >= 0 (got {value})")
    if args.seed is not None and not 0 <= args.seed <= SEED_MAX:    # each rank seeds TF with seed + rank
        p.error(f"--seed must be a whole number in 0..{SEED_MAX} (got {args.seed}); each rank uses seed + rank")
    for name in ("json", "events"):             # files rank 0 writes at the end: their folder must be there now
        folder = os.path.dirname(os.path.abspath(getattr(args, name))) if getattr(args, name) else ""
        if folder and not os.path.isdir(folder):
            p.error(f"--{name} {getattr(args, name)}: its folder {folder} does not exist (create it first)")
    if args.as_workers and args.elastic:
        p.error("--as-workers is a one-process control run; it does not combine with --elastic")
    return args


INIT_STALLED = 3        # the exit status of a rank whose hvd.init() outlived --init-timeout
STALLED = "hvd.init() did not return within"       # how its message starts (launchers and tests look for it)


def init_within(hvd, timeout: float) -> None:
    """hvd.init(), or end this process with INIT_STALLED and a message after `timeout` s (0: no bound).

    Why: on a 2-core machine running 4 ranks, Open MPI's first collective (the MPI_Comm_dup in Horovod's
    MPIContext::Initialize) has stalled for good in about 1 start in 3 under load; the ranks wait in
    ompi_comm_nextcid while a TCP connection sits unaccepted (docs/cluster.md, "A start that stalls"). One
    rank's exit makes mpiexec end the whole job: the launcher returns, with a message, instead of hanging."""
    if not timeout:
        hvd.init()
        return
    import sys
    import threading

    def stalled():
        print(f"kit.mnist.train: {STALLED} {timeout:g} s (pid {os.getpid()}): the job's "
              "start stalled; ending it. Start it again (with --checkpoint-dir it resumes), or raise "
              "--init-timeout.", file=sys.stderr, flush=True)
        os._exit(INIT_STALLED)

    timer = threading.Timer(timeout, stalled)
    timer.daemon = True
    timer.start()
    try:
        hvd.init()        # Horovod's ctypes call releases the GIL: the timer can fire while it waits
    finally:
        timer.cancel()


def private_temp_dir() -> str:
    """Give this process (TensorFlow's autograph files included) a temp folder of its own, removed at exit; one
    left by a killed run is swept by the next kit.scratch.make, as the kit's other scratch folders are."""
    folder = scratch.make("train")
    os.environ["TMPDIR"] = tempfile.tempdir = folder
    atexit.register(scratch.remove, folder)
    return folder


def main(argv=None):
    """Train the classic Keras MNIST CNN on every rank of the job (or time it: --synthetic-steps); rank 0 returns
    the result (and writes it to --json)."""
    args = parse_args(argv)
    private_temp_dir()
    tf, hvd = import_frameworks(args)
    from horovod.tensorflow import allgather_object
    from kit import mnist

    # Horovod (1): start Horovod; every process learns its rank and the job's size.
    init_within(hvd, args.init_timeout)
    if args.as_workers and hvd.size() > 1:
        raise SystemExit(f"kit.mnist.train: --as-workers is for one process (this job has {hvd.size()}): it trains "
                         "one process as N workers would; drop it, or run with -np 1")
    # Horovod (2): one GPU per process, chosen by local rank (on a CPU-only machine there is nothing to pin).
    pin_gpu(tf, hvd)
    root = hvd.rank() == 0
    check_checkpoint_dir(args.checkpoint_dir, hvd)
    if args.synthetic_steps:
        return synthetic(args, hvd)
    ds, (x, y), test = load_data(args, tf, hvd)
    if args.elastic:
        return train_elastic(args, tf, hvd, x, y)
    # Horovod: each rank trains on its own 1/size of the data: an epoch is one pass over the data shared by
    # the ranks (1/size of the steps, each on size x batch images), so the job keeps one process's 12 epochs.
    x, y = mnist.shard(x, y, hvd.rank(), hvd.size())
    epochs = args.epochs or mnist.EPOCHS
    workers, batch = args.as_workers or hvd.size(), args.batch_size * (args.as_workers or 1)

    model = mnist.build_model()
    # Horovod (3) and (4): scale the learning rate by size (linear scaling rule); average gradients with allreduce.
    scaled_lr = mnist.BASE_LR * workers
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.Adam(scaled_lr))
    model.compile(loss="sparse_categorical_crossentropy", optimizer=opt, metrics=["accuracy"])
    initial_epoch = mnist.resume(model, args.checkpoint_dir, hvd)   # Horovod: rank 0's checkpoint, broadcast

    history = []
    callbacks = schedule_callbacks(args, hvd, scaled_lr, workers, mnist.steps_per_epoch(len(x), 1, batch), epochs)
    # Horovod (6): only rank 0 writes checkpoints and prints progress.
    if root:
        if args.checkpoint_dir:
            callbacks.append(mnist.checkpoint_callback(args.checkpoint_dir))
        callbacks.append(mnist.epoch_log(len(x) * hvd.size(), history))
        print(f"training on {hvd.size()} worker(s), {len(x)} images each, epochs {initial_epoch + 1}..{epochs}"
              + (f", as {workers} workers: batch {batch}" if args.as_workers else ""), flush=True)
    model.fit(x, y, batch_size=batch, epochs=epochs, initial_epoch=initial_epoch, verbose=0,
              validation_data=test, callbacks=callbacks)

    digests = allgather_object(mnist.weights_digest(model), name="digest")  # Horovod: replicas equal?
    if root:
        return report(args, ds.name, hvd.size(), epochs, history, len(set(digests)) == 1)


def import_frameworks(args):
    """Pin this process and set TF's thread counts (before TF starts its threads); return (tf, horovod's Keras)."""
    from kit import env, mnist
    if args.pin or args.pin_by_rank:                      # by the launcher's (local) rank, before TF starts threads
        env.pin_to_core(env.rank() if args.pin_by_rank else None)
    if args.threads:
        os.environ["TF_NUM_INTRAOP_THREADS"] = str(args.threads)
    if args.inter_op_threads:
        os.environ["TF_NUM_INTEROP_THREADS"] = str(args.inter_op_threads)
    tf = mnist.import_tf_quietly()                        # import tensorflow, minus its C++ start-up log lines
    import horovod.tensorflow.keras as hvd
    return tf, hvd


def pin_gpu(tf, hvd):
    """Let this process see only the GPU of its local rank (growing its memory as needed); nothing without GPUs."""
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")


def check_checkpoint_dir(folder, hvd):
    """Rank 0 checks that it can write `folder` (if given); every rank stops with its answer if not."""
    if not folder:
        return
    from horovod.tensorflow import broadcast_object
    from kit import mnist
    problem = None
    if hvd.rank() == 0:
        try:
            mnist.check_writable(folder)
        except mnist.CheckpointError as e:
            problem = str(e)
    problem = broadcast_object(problem, root_rank=0, name="checkpoint_dir_check")
    if problem:
        raise SystemExit(f"kit.mnist.train: {problem}" if hvd.rank() == 0 else 1)


def synthetic(args, hvd) -> dict:
    """Measure samples/s on random data for --synthetic-steps steps; rank 0 prints it (and writes --json)."""
    from kit import mnist
    result = mnist.synthetic_throughput(hvd, steps=args.synthetic_steps, batch=args.batch_size)
    if hvd.rank() == 0:
        print(json.dumps(result), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(result))
    return result


def load_data(args, tf, hvd):
    """Return (the data set, its training (x, y), its test (x, y)), prepared, subset; seed this rank if asked."""
    from kit import datasets, mnist
    ds = datasets.load(args.dataset, verbose=hvd.rank() == 0)
    train = mnist.prepare(*mnist.subset(ds.x_train, ds.y_train, args.train_samples))
    test = mnist.prepare(*mnist.subset(ds.x_test, ds.y_test, args.test_samples))
    if args.seed is not None:
        # seed + rank: each rank its own dropout masks and shuffling (the same seed on every rank gave every rank
        # the same masks at every step). Rank 0 keeps `seed`: its initial weights, broadcast to all, are the
        # one-process run's. (docs/benchmarks/mnist.md: the fix did not close the 2-worker accuracy gap.)
        tf.keras.utils.set_random_seed(args.seed + hvd.rank())
    return ds, train, test


def schedule_callbacks(args, hvd, scaled_lr: float, workers: int, steps_per_epoch: int, epochs: int) -> list:
    """Return every rank's callbacks: rank 0's weights to all, averaged metrics, the learning-rate schedule."""
    from kit import mnist
    return [
        # Horovod (5): start every replica from rank 0's weights.
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        # Horovod: average the metrics over ranks, so rank 0 prints the job's loss, not its own shard's.
        hvd.callbacks.MetricAverageCallback(),
        # Horovod: ramp the learning rate from lr to lr * size over the first epochs (Goyal et al., 2017).
        warmup_callback(hvd, scaled_lr, workers, steps_per_epoch, args.warmup_epochs or mnist.WARMUP_EPOCHS,
                        control=bool(args.as_workers)),
        # ... and divide it by 10 for the last quarter of the epochs (Goyal et al.'s step decay), so they settle.
        # A function, not the number: a constant multiplier m means m ** (epoch - start_epoch), a decay per epoch.
        hvd.callbacks.LearningRateScheduleCallback(initial_lr=scaled_lr, multiplier=lambda epoch: mnist.DECAY,
                                                   start_epoch=mnist.decay_start(epochs)),
    ]


def report(args, dataset: str, size: int, epochs: int, history: list, identical: bool) -> dict:
    """Rank 0: print the test accuracy, write the result to --json; return it."""
    acc = history[-1]["val_accuracy"] if history else float("nan")
    result = {"dataset": dataset, "size": size, "as_workers": args.as_workers, "epochs": epochs,
              "history": history, "test_accuracy": acc, "replicas_identical": identical}
    if args.json:
        Path(args.json).write_text(json.dumps(result))
    print(f"done: {dataset} test accuracy {acc:.4f} after {epochs} epochs on {size} worker(s); "
          f"replicas identical: {identical}", flush=True)
    return result


def warmup_callback(hvd, scaled_lr: float, workers: int, steps_per_epoch: int, warmup_epochs: float,
                    control: bool = False):
    """Horovod's warmup from scaled_lr / size to scaled_lr; `control` (--as-workers): the same ramp for `workers`
    in one process (Horovod's callback reads hvd.size(), which is 1 there)."""
    if not control:
        return hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, steps_per_epoch=steps_per_epoch,
                                                        warmup_epochs=warmup_epochs)

    def ramp(epoch):                    # Horovod's multiplier, with `workers` for hvd.size()
        epoch += 1.0 / steps_per_epoch
        return 1.0 / workers * (epoch * (workers - 1) / warmup_epochs + 1)
    return hvd.callbacks.LearningRateScheduleCallback(initial_lr=scaled_lr, multiplier=ramp, start_epoch=0,
                                                      end_epoch=warmup_epochs, staircase=False,
                                                      steps_per_epoch=steps_per_epoch)


def train_elastic(args, tf, hvd, x_all, y_all):
    """Elastic Horovod: ranks may leave (a host lost) and join (a host back) while the job runs."""
    from kit import mnist
    from kit.mnist import elastic
    model = mnist.build_model()
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.Adam(mnist.BASE_LR * hvd.size()))
    model.compile(loss="sparse_categorical_crossentropy", optimizer=opt, metrics=["accuracy"])
    opt.build(model.trainable_variables)              # the optimizer's slots exist before the first commit
    # Elastic (1): what every rank must agree on: weights, optimizer slots, the epoch, the batch, batches done.
    # A commit copies it in memory; after a lost rank, every survivor goes back to its last commit.
    state = hvd.elastic.KerasState(model, batch=0, epoch=0, done=0)

    # Elastic (2): after the world changed: a new size, so a new learning rate (linear scaling rule).
    def on_reset():
        tf.keras.backend.set_value(state.model.optimizer.lr, mnist.BASE_LR * hvd.size())
    state.register_reset_callbacks([on_reset])

    # Elastic (3): hvd.elastic.run calls train; when a collective fails (HorovodInternalError) or hosts change
    # (HostsUpdatedInterrupt), it restores or keeps the state, re-forms the ring with the hosts now alive,
    # broadcasts rank 0's state to newcomers and calls train again.
    @hvd.elastic.run
    def train(state):
        x, y = mnist.shard(x_all, y_all, hvd.rank(), hvd.size())     # shards follow the current size
        steps = mnist.steps_per_epoch(len(x), 1, args.batch_size)           # Keras' count: the partial batch too
        state.model.fit(x, y, batch_size=args.batch_size, steps_per_epoch=steps,
                        epochs=(args.epochs or mnist.EPOCHS) - state.epoch, verbose=0, callbacks=[
                            elastic.event_log(state, args.events, hvd, args.batch_size),   # counts state.done
                            hvd.elastic.CommitStateCallback(state, batches_per_commit=args.commit_every),
                            hvd.elastic.UpdateBatchStateCallback(state),
                            hvd.elastic.UpdateEpochStateCallback(state)])
    train(state)
    if hvd.rank() == 0:
        print(f"done: elastic training ended on {hvd.size()} worker(s) after {state.done} batches", flush=True)


if __name__ == "__main__":
    main()
