"""The framework environment, in one place: Keras 2 for Horovod, quiet TensorFlow, cores, pinning, ranks.

Everything here is cheap and imports no framework. ``import kit`` calls :func:`use_legacy_keras`; engines started
by ``kit.cluster`` and children started by ``horovodrun``/``mpirun`` get :data:`FRAMEWORK_ENV` in their
environment, so the variables are set before TensorFlow is first imported, wherever the code runs.
"""
from __future__ import annotations

import os

# Horovod's Keras integration needs the Keras 2 API (the tf-keras package), chosen by this variable before
# TensorFlow is first imported (README "Why tf-keras"; horovod#4290). TF_CPP_MIN_LOG_LEVEL=2 keeps
# TensorFlow's C++ start-up lines out of the notebooks' outputs.
FRAMEWORK_ENV = {"TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}

# Where a launcher records this process's place in the job: the kit's own variables first (kit.cluster sets them
# for every engine), then horovodrun's, then Open MPI's (mpirun, and kit.cluster's MPI engines).
_RANK_VARS = {
    "rank": ("KIT_RANK", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"),
    "size": ("KIT_SIZE", "HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"),
    "local_rank": ("KIT_LOCAL_RANK", "HOROVOD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_LOCAL_RANK"),
    "local_size": ("KIT_LOCAL_SIZE", "HOROVOD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_LOCAL_SIZE"),
}
_DEFAULTS = {"rank": 0, "size": 1, "local_rank": 0, "local_size": 1}


def use_legacy_keras(environ=None) -> None:
    """Set FRAMEWORK_ENV in `environ` (default: this process) unless the user chose otherwise already."""
    environ = os.environ if environ is None else environ
    for k, v in FRAMEWORK_ENV.items():
        environ.setdefault(k, v)


def _from_env(what: str) -> int:
    for var in _RANK_VARS[what]:
        if os.environ.get(var, "").strip():
            return int(os.environ[var])
    return _DEFAULTS[what]


def rank() -> int:
    """This process's rank in the job, as its launcher assigned it (0 outside any job)."""
    return _from_env("rank")


def size() -> int:
    """Number of processes in the job (1 outside any job)."""
    return _from_env("size")


def local_rank() -> int:
    """This process's rank among the job's processes on this host (0 outside any job)."""
    return _from_env("local_rank")


def local_size() -> int:
    """Number of the job's processes on this host (1 outside any job)."""
    return _from_env("local_size")


def is_root() -> bool:
    """True on the rank that writes checkpoints, logs and plots (rank 0), and outside any job."""
    return rank() == 0


def cpu_cores() -> int:
    """Return the number of cores this process may run on (affinity-aware): the one count the kit uses."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def pin_threads(cores) -> set[int]:
    """Pin every thread of this process (and the threads they start later) to `cores`; return the calling
    thread's previous affinity, so that `pin_threads(previous)` undoes it. Linux only."""
    before = os.sched_getaffinity(0)
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), set(cores))
        except OSError:                         # a thread that just exited
            pass
    return before


def pin_to_core(local_rank_: int | None = None) -> int:
    """Pin this process to one core chosen by local rank (default: from the launcher); return the core."""
    lr = local_rank() if local_rank_ is None else local_rank_
    cores = sorted(os.sched_getaffinity(0))
    core = cores[lr % len(cores)]
    pin_threads({core})
    return core
