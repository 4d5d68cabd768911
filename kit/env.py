"""The framework environment, in one place: Keras 2 for Horovod, quiet TensorFlow, cores, pinning, ranks.

Everything here is cheap and imports no framework. ``import kit`` calls :func:`use_legacy_keras`; engines started
by ``kit.cluster`` and children started by ``horovodrun``/``mpirun`` get :data:`FRAMEWORK_ENV` in their
environment, so the variables are set before TensorFlow is first imported, wherever the code runs.
"""
from __future__ import annotations

import importlib.util
import os
import re
import select
import sys
import threading

KIT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the folder that holds `kit` (results/, ...)

# Horovod's Keras integration needs the Keras 2 API (the tf-keras package), chosen by this variable before
# TensorFlow is first imported (docs/install.md "Why tf-keras"; horovod#4290). TF_CPP_MIN_LOG_LEVEL=2 keeps
# TensorFlow's C++ start-up lines out of the notebooks' outputs.
FRAMEWORK_ENV = {"TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}

# Open MPI settings for the engines the kit starts (kit.cluster), for mpirun jobs (kit.mnist) and
# for the lab's SSH sessions (kit.netlab).
# Open MPI refuses to run as root without these; a plain user gets none of them.
# Open MPI busy-polls while it waits for a message; with as many ranks as cores (or more) that spinning takes the
# core from the rank's compute thread. Yielding when idle: 2 pinned workers of kit.mnist.train on 2
# cores went from 1,434 to 2,072 samples/s (Gloo: 1,836; docs/benchmarks/mnist.md). Root needs the two ALLOWs.
MPI_ENV = {"OMPI_MCA_mpi_yield_when_idle": "1",
           **({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"} if os.geteuid() == 0 else {})}

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


class _TritonBeforeTensorFlow:
    """A meta-path finder that, the moment TensorFlow is first imported, imports Triton just before it."""

    def find_spec(self, name, path=None, target=None):
        if name == "tensorflow":
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            try:
                import triton  # noqa: F401
            except Exception:       # a broken triton is torch's business, not a reason to stop TensorFlow
                pass
        return None                 # the normal finders import the module itself


def load_triton_before_tensorflow() -> bool:
    """Where Triton is installed (it comes with PyTorch's CUDA builds), make it load before TensorFlow.

    TensorFlow >= 2.20 loads its library with RTLD_GLOBAL, so a Triton loaded after it binds to TensorFlow's LLVM
    and segfaults (tensorflow/tensorflow#124205); PyTorch imports Triton lazily, at the first `torch.optim`
    optimizer. So any process that imports TensorFlow and then builds a PyTorch optimizer (a test suite, a
    notebook kernel, an engine running both frameworks) crashed. Loading Triton first is the known workaround
    (PythonOT/POT#839). Cheap: nothing is imported until TensorFlow is. Returns whether the hook was installed."""
    if "tensorflow" in sys.modules or importlib.util.find_spec("triton") is None:
        return False
    if not any(isinstance(f, _TritonBeforeTensorFlow) for f in sys.meta_path):
        sys.meta_path.insert(0, _TritonBeforeTensorFlow())
    return True


# TensorFlow's C++ start-up lines that TF_CPP_MIN_LOG_LEVEL misses: they are logged (absl format, "I0000 hh:mm:ss.us
# tid file:line] msg") before TensorFlow tells absl the level, behind absl's banner (tensorflow#79029, abseil-cpp#1718).
_ABSL_BANNER = b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
_ABSL_LINE = re.compile(rb"([IWEF])\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [^ \]]+:\d+\] ")


def native_noise(line: bytes, min_level: int, cpu_only: bool) -> bool:
    """Return True for a C++ log line that TF_CPP_MIN_LOG_LEVEL=min_level means to hide (and, on a process that
    runs on the CPU by design, the expected "failed call to cuInit")."""
    if line.rstrip() == _ABSL_BANNER:
        return True
    m = _ABSL_LINE.match(line)
    return bool(m) and ("IWEF".index(m[1].decode()) < min_level or (cpu_only and b"failed call to cuInit" in line))


def quiet_native_stderr() -> None:
    """Route this process's file descriptor 2 (C/C++ output) through a thread that drops :func:`native_noise`
    lines and passes everything else on unchanged (Python's own stderr is untouched). Engines call it at set-up,
    so TensorFlow's start-up lines do not show under %%px cells. Once per process; Unix only."""
    global _QUIETED
    if _QUIETED or not hasattr(select, "select"):
        return
    min_level = int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0") or 0)
    cpu_only = os.environ.get("CUDA_VISIBLE_DEVICES") == "" or not os.path.exists("/proc/driver/nvidia/version")
    src, w = os.pipe()
    dst = os.dup(2)
    os.dup2(w, 2)
    os.close(w)
    threading.Thread(target=_pump, args=(src, dst, lambda ln: native_noise(ln, min_level, cpu_only)),
                     name="kit-quiet-stderr", daemon=True).start()
    _QUIETED = True


_QUIETED = False   # quiet_native_stderr ran in this process (fd 2 is already filtered)


def _pump(src: int, dst: int, drop) -> None:
    """Copy src to dst line by line, leaving out lines for which drop(line); a partial line goes on after 0.2 s."""
    def write(data):
        while data:
            data = data[os.write(dst, data):]
    buf = b""
    while True:
        if buf and not select.select([src], [], [], 0.2)[0]:
            write(buf)
            buf = b""
            continue
        chunk = os.read(src, 65536)
        if not chunk:
            break
        *lines, buf = (buf + chunk).split(b"\n")
        write(b"".join(ln + b"\n" for ln in lines if not drop(ln)))
    write(buf)


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


def cpu_cores() -> int:
    """Return the number of cores this process may run on (affinity-aware): the one count the kit uses."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def machine_id() -> str:
    """Return an id of the running kernel (its boot id): the same for every emulated host of a kit.netlab lab,
    which share one machine's cores, and different on different machines (the host name where there is none)."""
    try:
        return open("/proc/sys/kernel/random/boot_id").read().strip()
    except OSError:
        import socket
        return socket.gethostname()


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
