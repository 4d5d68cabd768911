"""The engines as processes: what runs on them at start-up, and how the notebook watches and reaps them.

Used by ``kit.cluster``: the functions named ``engine_*`` are sent to the engines (by reference to this module);
the rest runs in the notebook's process.
"""
from __future__ import annotations

import os
import re
import threading

from kit import scratch


# ----------------------------------------------------------------------------------- run on the engines
def engine_identity():
    """Return this engine's host, pid, (under mpiexec) its MPI rank, local rank and local size, (under srun) its
    Slurm task rank and local rank, the cores it may use and the machine it runs on (kit.netlab's hosts are one
    machine), and (KIT_ROUTE_TO set) the interface its route to that address leaves by."""
    import os
    import re
    import socket
    import subprocess
    from kit.env import cpu_cores, machine_id
    e = os.environ
    mpi = {k: int(e[v]) for k, v in (("rank", "OMPI_COMM_WORLD_RANK"), ("local_rank", "OMPI_COMM_WORLD_LOCAL_RANK"),
                                     ("local_size", "OMPI_COMM_WORLD_LOCAL_SIZE")) if v in e}
    slurm = {k: int(e[v]) for k, v in (("rank", "SLURM_PROCID"), ("local_rank", "SLURM_LOCALID")) if v in e}
    out = {"host": socket.gethostname(), "pid": os.getpid(), "mpi": mpi, "slurm": slurm, "cores": cpu_cores(),
           "machine": machine_id()}
    if e.get("KIT_ROUTE_TO"):
        route = subprocess.run(["ip", "-o", "route", "get", e["KIT_ROUTE_TO"]], capture_output=True, text=True)
        out["route_iface"] = (re.findall(r"\bdev (\S+)", route.stdout) or [""])[0]
    return out


def engine_setup(env):
    """Set the job's environment on this engine (TMPDIR too); start its stall watch; refuse if a framework was
    imported before."""
    import os
    import sys
    import tempfile
    early = [m for m in ("torch", "tensorflow", "horovod") if m in sys.modules]
    if early:
        raise RuntimeError(f"{early} were imported before kit.cluster set this engine up")
    os.environ.update(env)
    if env.get("TMPDIR"):
        os.makedirs(env["TMPDIR"], exist_ok=True)
        tempfile.tempdir = None           # tempfile read TMPDIR already: read it again
    if env.get("KIT_STALL_DIR"):
        from kit.cluster import stall
        stall.engine_watch(env["KIT_STALL_DIR"], int(env["KIT_RANK"]))
    import faulthandler
    # A crash's report goes to the engine's output file itself, not through a pipe whose reader thread dies with the
    # process: ipykernel's (fd 2 under %%px; its copy of the file) or the kit's filter below.
    out = getattr(sys.stderr, "_original_stdstream_copy", None)
    faulthandler.enable(file=os.dup(2) if out is None else out, all_threads=True)
    from kit.env import quiet_native_stderr
    quiet_native_stderr()   # TensorFlow's C++ start-up lines that TF_CPP_MIN_LOG_LEVEL misses: not under %%px


def engine_check_horovod():
    """Initialise Horovod here and allreduce a one: every rank must see size n and sum n."""
    import horovod.torch as hvd
    import torch
    hvd.init()
    total = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="kit.cluster.check").item()
    return {"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(), "sum": total}


def engine_free_address():
    """Return this host's name and a free TCP port (for torch.distributed's store on rank 0)."""
    import socket
    with socket.socket() as s:
        s.bind(("", 0))
        return socket.gethostname(), s.getsockname()[1]


def engine_init_process_group(init_method, timeout, backend="gloo"):
    """Join the torch.distributed group (gloo, or nccl on GPU engines) with this engine's kit rank; allreduce a one
    to check it (on the engine's GPU, device 0, for nccl)."""
    import datetime
    import os
    import torch
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()
    rank, size = int(os.environ["KIT_RANK"]), int(os.environ["KIT_SIZE"])
    if backend == "nccl":
        torch.cuda.set_device(0)             # inside an engine its one visible GPU is device 0
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=timeout))
    t = torch.ones(1, device="cuda" if backend == "nccl" else "cpu")
    dist.all_reduce(t)
    return {"rank": dist.get_rank(), "size": dist.get_world_size(), "sum": t.item()}


# ----------------------------------------------------------------------------------- the engines' environment
def engine_env(slot, *, gpus: list[str], threads: int, timeout: float, folder: str = "") -> dict[str, str]:
    """Return the environment one engine needs before it imports any framework (folder: the cluster's scratch
    folder, where its TMPDIR and stall watch live). Whole-second settings get the timeout rounded up
    (kit.cluster.checks.whole_seconds: 0.5 s gives 1 s, never Horovod's 0)."""
    from kit import env as kit_env
    from kit.cluster import stall
    from kit.cluster.checks import whole_seconds
    env = {
        "KIT_RANK": slot.rank, "KIT_SIZE": slot.size, "KIT_LOCAL_RANK": slot.local_rank,
        "KIT_LOCAL_SIZE": slot.local_size, "KIT_TIMEOUT": whole_seconds(timeout), "PYTHONUNBUFFERED": 1,
        **kit_env.FRAMEWORK_ENV,
        # n engines share the cores: each framework gets cores / local_size intra-op threads.
        "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "TF_NUM_INTRAOP_THREADS": threads,
        # One GPU per process, chosen by local rank (set before any framework sees the devices): inside the
        # engine that GPU is device 0. No GPUs in the plan: the engine sees none and runs on the CPU.
        "CUDA_VISIBLE_DEVICES": gpus[slot.local_rank % len(gpus)] if gpus else "",
        "HOROVOD_GLOO_TIMEOUT_SECONDS": whole_seconds(timeout),
        **stall.horovod_env(whole_seconds(timeout)),
    }
    if folder:
        env.update(TMPDIR=os.path.join(folder, "tmp"), KIT_STALL_DIR=os.path.join(folder, "stall"),
                   **cache_env(os.path.join(folder, "tmp")))
    return {k: str(v) for k, v in env.items()}


def cache_env(tmp: str) -> dict[str, str]:
    """Return the variables that put torch.compile's caches (Inductor's, Triton's) in `tmp`, a private folder,
    not in $TMPDIR/torchinductor_<user>, a name anyone can take first."""
    return {"TORCHINDUCTOR_CACHE_DIR": os.path.join(tmp, "torchinductor"),
            "TRITON_CACHE_DIR": os.path.join(tmp, "triton")}



# ----------------------------------------------------------------------------------- the notebook side
def in_ipython() -> bool:
    """Return whether this process is an IPython kernel or shell."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    return get_ipython() is not None


def install_ipython_hook(explain):
    """Call explain(shell, etype, value, tb, tb_offset) when a %%px cell fails (an engine raised or died)."""
    from IPython import get_ipython
    from ipyparallel.error import EngineError, RemoteError
    # RemoteError: CompositeError (view.apply) and AlreadyDisplayedError (what %%px raises after streaming)
    get_ipython().set_custom_exc((RemoteError, EngineError), explain)
    # no "%px: 0%" progress bar (a widget that saved notebooks show frozen); %%px output still streams live
    get_ipython().run_line_magic("pxconfig", "--progress-after -1")


def descendants() -> dict[int, int]:
    """Return {pid: start time (kit.scratch.started)} of every process below this one."""
    import psutil
    out = {}
    for p in psutil.Process().children(recursive=True):
        t = scratch.started(p.pid)
        if t is not None:
            out[p.pid] = t
    return out


def terminate(procs: dict[int, int]):
    """SIGTERM every ipyparallel engine in {pid: start time} (kit.scratch.started), and do not wait."""
    import psutil
    for pid, t in procs.items():
        try:
            p = psutil.Process(pid)
            if p.cmdline()[1:3] == ["-m", "ipyparallel.engine"] and scratch.started(pid) == t:
                p.terminate()
        except (psutil.Error, IndexError):
            pass


def reap(procs: dict[int, int], grace: float = 5.0):
    """Terminate, then kill, every process in {pid: start time} still alive (the start time guards pid reuse)."""
    import psutil
    alive = []
    for pid, t in procs.items():
        try:
            if scratch.started(pid) == t:
                alive.append(psutil.Process(pid))
        except psutil.Error:
            pass
    scratch.end(alive, grace)


def kernel_log() -> list[tuple[float, str]] | None:
    """Return the kernel's log as (seconds since boot, message) records (/dev/kmsg, as `dmesg` reads it), or None
    where this user may not read it (kernel.dmesg_restrict=1 without root)."""
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    records = []
    try:
        while True:
            try:
                record = os.read(fd, 8192).decode("utf-8", "replace")
            except BlockingIOError:          # the end of the buffer
                break
            except BrokenPipeError:          # records overwritten while reading: go on with the next one
                continue
            head, _, message = record.partition(";")
            fields = head.split(",")
            records.append((int(fields[2]) / 1e6 if len(fields) > 2 and fields[2].isdigit() else 0.0,
                            message.strip()))
    finally:
        os.close(fd)
    return records


def how_it_died(pid: int, started: int = 0, log: list[tuple[float, str]] | None = None, output: str = "") -> str:
    """Return how process `pid` (started `started` clock ticks after boot: kit.scratch.started) ended, for a
    RankDiedError: "was killed by the kernel's OOM killer: out of memory ..." when the kernel log says so after its
    start ("Killed process PID" / "oom-kill:...pid=PID"), else "exited"; then `output` (its last words), if any."""
    said = f"; its last output:\n{output}\n" if output else ""
    log = kernel_log() if log is None else log
    since_boot = started / os.sysconf("SC_CLK_TCK")
    oom = re.compile(rf"(Killed process {pid}\b|oom-kill:.*\bpid={pid}\b)")
    if log and any(t >= since_boot - 1 and oom.search(message) for t, message in log):
        return ("was killed by the kernel's OOM killer: out of memory (use less memory per engine: smaller "
                "batches or model, fewer engines per host)" + said)
    return "exited" + said


_IPP_LOG = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ \[(IPEngine|KernelNanny)[.\]]")  # ipyparallel's own lines


def output_files(ipp_cluster) -> dict[int, str]:
    """Return {pid: output file} for the engines ipyparallel started on this machine with a file each (not
    mpiexec's or Slurm's engines, which share one, nor SSH's, whose process here is ssh)."""
    files = {}
    for es in list((getattr(ipp_cluster, "engines", None) or {}).values()):
        for la in list((getattr(es, "launchers", None) or {}).values()):
            try:
                if la.output_file and la.pid:
                    files[la.pid] = la.output_file
            except AttributeError:
                pass
    return files


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")     # IPython's colours in the tracebacks an engine prints


def last_output(path: str, lines: int = 12, since: int = 0) -> str:
    """Return the end of an engine's output file (from `output_files`) from byte `since` on (where the file ended
    when the engine's last task was sent: an earlier task's error is not this one's), indented, without colours
    and ipyparallel's own log lines; after a crash, the lines just before Python's fault handler's report (C++'s
    "terminate called ..."), the report and the crashing thread's stack (engine_setup points the fault handler at
    this file, so the report is whole once the process is gone); "" without a file."""
    try:
        with open(path, "rb") as f:
            f.seek(max(since, os.path.getsize(path) - 64_000))
            text = _ANSI.sub("", f.read().decode(errors="replace"))
    except OSError:
        return ""
    out = [line for line in text.rstrip().splitlines() if not _IPP_LOG.match(line)]
    fatal = next((i for i, line in enumerate(out) if line.startswith("Fatal Python error")), None)
    if fatal is None:
        keep = out[-lines:]
    else:   # the lines just before (C++'s "terminate called ..."), the report, and the crashing thread, or where
        #     a thread of C++ crashed (a signal taken by a framework's thread), the last listed: the main thread
        keep = out[max(0, fatal - 3):fatal + 1]
        heads = [i for i in range(fatal, len(out)) if out[i].startswith(("Current thread", "Thread 0x"))]
        cur = next((i for i in heads if out[i].startswith("Current thread")), heads[-1] if heads else len(out))
        keep += _stack(out, cur, lines)
        if heads and cur != heads[-1]:
            # another thread took the signal (seen: a heap that Gloo's unchecked ring overran, found corrupt by
            # zmq's thread): the main thread, listed last by the fault handler, is where the task's call was
            keep += _stack(out, heads[-1], lines)
    return "\n".join("    " + line for line in keep)


def _stack(out: list[str], head: int, lines: int) -> list[str]:
    """Return the fault handler's stack of one thread: its heading line out[head] and at most `lines` lines after
    it, up to the first blank line."""
    end = next((i for i in range(head, len(out)) if not out[i].strip()), len(out))
    return out[head:min(end, head + lines)]


def watch_deaths(pids: dict[int, int], on_death) -> int | None:
    """Call on_death(rank) the moment each process in {rank: pid} exits (pidfd; first death first).

    Return the write end of a pipe: write a byte to it to end the watch (then close it). None where the OS has no
    pidfd (not Linux); the cluster then finds the dead by polling, without their order.
    """
    if not hasattr(os, "pidfd_open"):
        return None
    import select
    fds, poller = {}, select.poll()
    for rank, pid in pids.items():
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            continue
        fds[fd] = rank
        poller.register(fd, select.POLLIN)
    stop_r, stop_w = os.pipe()
    poller.register(stop_r, select.POLLIN)

    def watch():
        try:
            while fds:
                ready = [fd for fd, _ in poller.poll()]
                if stop_r in ready:
                    return
                for fd in ready:
                    poller.unregister(fd)
                    on_death(fds.pop(fd))
        finally:
            for fd in [*fds, stop_r]:
                try:
                    os.close(fd)
                except OSError:
                    pass
    threading.Thread(target=watch, daemon=True, name="kit-engine-watch").start()
    return stop_w


def end_watch(stop_w: int | None) -> None:
    """End a watch_deaths thread through its pipe (the thread closes its own fds); return None."""
    if stop_w is not None:
        try:
            os.write(stop_w, b"x")
        except OSError:
            pass
        os.close(stop_w)
