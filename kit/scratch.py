"""One temp folder per cluster (or other thing) the kit starts, removed when it stops, swept when its owner died.

    path = kit.scratch.make("cluster")   # <system temp>/kit-scratch-<uid>/cluster-<pid>-<start time>-<random>
    kit.scratch.remove(path)

Everything the kit starts for that thing (ipyparallel's profile, engines, mpiexec, their TMPDIR, so TensorFlow's
autograph files too) writes there. A folder whose owner process is gone (SIGKILL, a crashed kernel) is removed by
the next `make`, as kit.netlab sweeps a dead owner's lab.
"""
from __future__ import annotations

import os
import shutil
import tempfile


def root() -> str:
    """Return the one folder, in the system temp dir, that holds every kit scratch folder of this user."""
    return os.path.join(tempfile.gettempdir(), f"kit-scratch-{os.getuid()}")


def _owner_tag(pid: int) -> str | None:
    import psutil
    try:
        return f"{pid}-{int(psutil.Process(pid).create_time())}"
    except psutil.Error:
        return None


def sweep() -> list[str]:
    """Remove every scratch folder whose owner process is gone; return their paths."""
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
            shutil.rmtree(path, ignore_errors=True)
            gone.append(path)
    return gone


def make(kind: str) -> str:
    """Sweep dead owners' folders, then make and return a new folder for `kind`, owned by this process."""
    sweep()
    os.makedirs(root(), mode=0o700, exist_ok=True)
    return tempfile.mkdtemp(prefix=f"{kind}-{_owner_tag(os.getpid())}-", dir=root())


def remove(path: str | None):
    """Remove a scratch folder (and the root, once empty)."""
    if path:
        shutil.rmtree(path, ignore_errors=True)
    try:
        os.rmdir(root())
    except OSError:
        pass
