"""One temp folder per cluster (or other thing) the kit starts, removed when it stops, swept when its owner died.

    path = kit.scratch.make("cluster")   # <system temp>/kit-scratch-<uid>/cluster-<pid>-<start time>-<random>
    kit.scratch.remove(path)

Everything the kit starts for that thing (ipyparallel's profile, engines, mpiexec, their TMPDIR, so TensorFlow's
autograph files too) writes there. A folder whose owner process is gone (SIGKILL, a crashed kernel) is removed by
the next `make`, as kit.netlab sweeps a dead owner's lab, and so are the processes still running for it.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time


def root() -> str:
    """Return the one folder, in the system temp dir, that holds every kit scratch folder of this user."""
    return os.path.join(tempfile.gettempdir(), f"kit-scratch-{os.getuid()}")


def started(pid: int) -> int | None:
    """Return when process `pid` started, in clock ticks since boot (/proc/PID/stat), or None if there is no such
    process: with the pid, a name for one process that pid reuse cannot fake. Not psutil's create_time: that is
    boot time + ticks in wall-clock seconds, and a step of the wall clock (a VM whose clock is adjusted) changed it
    between two reads, so a live owner looked dead and its engines were ended (a failed dry run: every engine of a
    running cluster exited at once), and a cluster's stop skipped engines it should have ended."""
    try:
        return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[19])
    except OSError:
        pass
    if os.path.exists("/proc/self/stat"):
        return None                                 # Linux, and no such process
    import psutil                                   # elsewhere (macOS): the best there is
    try:
        return int(psutil.Process(pid).create_time() * 100)
    except psutil.Error:
        return None


def _owner_tag(pid: int) -> str | None:
    """Return "pid-start" for a live process (start: `started`), None for a dead one."""
    t = started(pid)
    return None if t is None else f"{pid}-{t}"


def processes_in(path: str) -> list:
    """Return the live processes (not this one) whose command line or TMPDIR names `path`: what was started there
    (an ipyparallel controller and engines, mpiexec and its daemons) and outlived its owner or its stop()."""
    import psutil
    out = []
    for p in psutil.process_iter(["cmdline", "environ", "status"]):
        if p.pid == os.getpid() or p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        words = [*(p.info["cmdline"] or []), (p.info["environ"] or {}).get("TMPDIR", "")]
        if any(path in w for w in words):
            out.append(p)
    return out


def end(procs: list, grace: float = 5.0):
    """SIGTERM `procs`, then SIGKILL what is left after `grace` s."""
    import psutil
    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    for p in _wait(procs, grace):
        try:
            p.kill()
        except psutil.Error:
            pass
    _wait(procs, grace)


def _wait(procs: list, timeout: float) -> list:
    """Wait up to `timeout` s for `procs` to end; return those still running. A zombie has ended: psutil's
    wait_procs counts it as alive until its parent reaps it, and an engine's nanny, orphaned when the engine
    ends, waits for the machine's init to do that (seconds, in a container)."""
    deadline, left = time.monotonic() + timeout, list(procs)
    while True:
        left = [p for p in left if _running(p)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


def _running(p) -> bool:
    import psutil
    try:
        return p.status() != psutil.STATUS_ZOMBIE     # a zombie is reaped by its parent, not waited for here
    except psutil.Error:
        return False


def sweep() -> list[str]:
    """Remove every scratch folder whose owner process is gone, ending first the processes it left running there
    (a SIGKILLed kernel's controller and engines); return the folders' paths."""
    gone = []
    try:
        names = os.listdir(root())
    except FileNotFoundError:
        return gone
    for name in names:
        parts = name.split("-")
        if len(parts) < 4 or not parts[1].isdigit():
            continue
        if _owner_tag(int(parts[1])) != f"{parts[1]}-{parts[2]}":
            path = os.path.join(root(), name)
            end(processes_in(path))
            shutil.rmtree(path, ignore_errors=True)
            gone.append(path)
    if gone:
        _remove_root_if_empty()           # the dead owner's folder was the last: leave no empty kit-scratch folder
    return gone


def make(kind: str) -> str:
    """Sweep dead owners' folders, then make and return a new folder for `kind`, owned by this process."""
    sweep()
    for attempt in range(3):
        os.makedirs(root(), mode=0o700, exist_ok=True)
        try:
            return tempfile.mkdtemp(prefix=f"{kind}-{_owner_tag(os.getpid())}-", dir=root())
        except FileNotFoundError:     # another process removed the root, empty, between makedirs and mkdtemp
            if attempt == 2:
                raise


def remove(path: str | None, end_processes: bool = False):
    """Remove a scratch folder (and the root, once empty); with `end_processes`, first end every process still
    running there (its command line or TMPDIR in the folder)."""
    if path and end_processes:
        end(processes_in(path))
    if path:
        shutil.rmtree(path, ignore_errors=True)
    _remove_root_if_empty()


def _remove_root_if_empty():
    try:
        os.rmdir(root())              # fails, as it should, while another folder is in it
    except OSError:
        pass
