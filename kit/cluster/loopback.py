"""Keep a one-host MPI job off the network (used by ``kit.cluster.launchers``): a tiny preload library that turns a
bind to every address (0.0.0.0, ::) into a bind to loopback (127.0.0.1, ::1).

Why: Open MPI 5.0.x's `mpiexec` (`prterun`) binds its daemon-control (OOB) listener to 0.0.0.0 and [::] whatever
its settings say, and `prte_if_include=lo` makes it refuse to start (open-mpi/ompi#14441, fixed by
openpmix/prrte#2788 in a PRRTE newer than the Open MPI that pip installs; tests/test_mpi_listeners.py notices the
fix). A one-host job has no daemons on other hosts to accept, so loopback is all it needs. The library is built
once with the C compiler that built Horovod (`cc`), into this user's cache (~/.cache/kit, checked to be this user's
and writable by no one else), and given to `mpiexec` (and so to the engines it starts) as LD_PRELOAD. No compiler:
None, and the listener stays where Open MPI puts it (docs/cluster.md says so).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import tempfile

SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

/* kit.cluster.loopback: a bind to every address becomes a bind to loopback (open-mpi/ompi#14441). */
int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    static int (*real)(int, const struct sockaddr *, socklen_t);
    if (!real) real = (int (*)(int, const struct sockaddr *, socklen_t))dlsym(RTLD_NEXT, "bind");
    if (addr && addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        struct sockaddr_in a;
        memcpy(&a, addr, sizeof a);
        if (a.sin_addr.s_addr == htonl(INADDR_ANY)) {
            a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            return real(fd, (const struct sockaddr *)&a, sizeof a);
        }
    } else if (addr && addr->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 a;
        memcpy(&a, addr, sizeof a);
        if (!memcmp(&a.sin6_addr, &in6addr_any, sizeof in6addr_any)) {
            a.sin6_addr = in6addr_loopback;
            return real(fd, (const struct sockaddr *)&a, sizeof a);
        }
    }
    return real(fd, addr, len);
}
"""


def cache_dir() -> str:
    """Return this user's kit cache folder (made 0700 if missing), e.g. ~/.cache/kit."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    folder = os.path.join(base, "kit")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    return folder


def _trusted(path: str, kind=stat.S_ISREG) -> bool:
    """Whether `path` is a file (or, kind=stat.S_ISDIR, a folder; never a symlink) of this user's that no one else
    may write: safe to preload from."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return kind(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def library() -> str | None:
    """Return the path of the preload library, building it on first use; None where it cannot be built."""
    try:
        folder = cache_dir()
    except OSError:
        return None
    path = os.path.join(folder, f"bind-loopback-{hashlib.sha256(SOURCE.encode()).hexdigest()[:12]}.so")
    if _trusted(path) and _trusted(folder, stat.S_ISDIR):
        return path
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or not _trusted(folder, stat.S_ISDIR):
        return None
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        src, out = os.path.join(tmp, "bind.c"), os.path.join(tmp, "bind.so")
        with open(src, "w") as f:
            f.write(SOURCE)
        try:
            built = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", out, src, "-ldl"], capture_output=True,
                                   timeout=120, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if built.returncode:
            return None
        os.chmod(out, 0o755)
        os.replace(out, path)                  # atomic: a concurrent start sees the old file or the new one
    return path if _trusted(path) else None


def preload_env() -> dict[str, str]:
    """Return {"LD_PRELOAD": ...} that keeps a one-host mpiexec's listeners on loopback ({} if it cannot)."""
    lib = library()
    if lib is None:
        return {}
    return {"LD_PRELOAD": " ".join(p for p in (lib, os.environ.get("LD_PRELOAD", "")) if p)}
