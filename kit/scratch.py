"""One private temp folder per cluster (or lab, or other thing) the kit starts, removed when it stops, swept when
its owner died.

    path = kit.scratch.make("cluster")   # <system temp>/kit-scratch-<uid>/cluster-<pid>-<start time>-<random>
    kit.scratch.remove(path)

Everything the kit starts for that thing (ipyparallel's profile, engines, mpiexec, their TMPDIR, so TensorFlow's
autograph files too) writes there. A folder whose owner process is gone (SIGKILL, a crashed kernel) is removed by
the next `make`, as kit.netlab sweeps a dead owner's lab, and so are the processes still running for it.

Private by construction (another user of the machine can neither plant nor swap anything in it): the per-user root
`kit-scratch-<uid>` is checked with lstat every time it is used, and must be a real folder (not a symbolic link),
owned by this uid, mode 0700, in a temp dir that others cannot rename things in (sticky, like /tmp); anything else
is refused with a `ScratchError` naming the path, what is wrong and what to do. Each folder is made with a random
name through a handle on the verified root (mkdir at a directory fd), so a root swapped meanwhile cannot receive
it. A sweep lists the root through that handle and removes only real folders this uid owns, never through a link.
The root is removed when it empties (the suite leaves nothing in /tmp): the name is then free again, and whoever
takes it next is refused by the next check, never used.
"""
from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import stat
import tempfile
import threading
import time


class ScratchError(RuntimeError):
    """The kit's temp folder is not private to this user; the message names the path and what to do."""


KIND_RE = re.compile(r"[A-Za-z][A-Za-z0-9_.]*(-[A-Za-z0-9_.]+)*")


def root() -> str:
    """Return the path of the one folder, in the system temp dir, that holds every kit scratch folder of this user
    (it may not exist: `private_root()` makes and checks it)."""
    return os.path.join(tempfile.gettempdir(), f"kit-scratch-{os.getuid()}")


def _owner_name(uid: int) -> str:
    import pwd
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def problem(path: str, st: os.stat_result, uid: int | None = None) -> str | None:
    """Return what makes `path` (its lstat `st`) not a private folder of `uid` (default: this user), or None."""
    uid = os.getuid() if uid is None else uid
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link (to {os.readlink(path)!r}), not a folder"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a folder"
    if st.st_uid != uid:
        return f"{path} belongs to {_owner_name(st.st_uid)}, not to {_owner_name(uid)}: another user made it first"
    if stat.S_IMODE(st.st_mode) != 0o700:
        return f"{path} has mode {stat.S_IMODE(st.st_mode):04o}, not 0700: other users could read or change it"
    return None


def _refused(what: str) -> ScratchError:
    """Return the error for a root that is not private: `what` is wrong, and what to do."""
    return ScratchError(f"{what}. The kit writes only in a folder private to you: remove it (`rm -r` as its owner "
                       f"or root) or set TMPDIR to a folder of your own")


def _check_parent(parent: str):
    """Refuse a temp dir where others could rename or remove our root (writable by others, no sticky bit)."""
    try:
        st = os.stat(parent)
    except OSError as e:
        raise ScratchError(f"the temp dir {parent} cannot be used ({e.strerror}): set TMPDIR to a folder of yours")
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise ScratchError(f"the temp dir {parent} is writable by others and not sticky (mode "
                           f"{stat.S_IMODE(st.st_mode):04o}): set TMPDIR to a folder of yours (or `chmod +t {parent}`)")


def _open_root(create: bool) -> int | None:
    """Return a directory fd on the verified root, made (mode 0700) if absent and `create`; None if absent."""
    path = root()
    _check_parent(os.path.dirname(path))
    made = False
    if create:
        try:
            os.mkdir(path, 0o700)
            made = True
        except FileExistsError:
            pass
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if create:                          # removed again by another of our processes: the caller retries
            raise
        return None
    if made and not stat.S_ISLNK(st.st_mode) and stat.S_IMODE(st.st_mode) != 0o700 and st.st_uid == os.getuid():
        os.chmod(path, 0o700, follow_symlinks=False)                 # a umask that took owner bits
        st = os.lstat(path)
    if why := problem(path, st):
        raise _refused(why)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as e:
        raise _refused(f"{path} cannot be opened as a folder ({e.strerror})")
    st2 = os.fstat(fd)
    if (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino) or problem(path, st2):   # swapped since the lstat
        os.close(fd)
        raise _refused(f"{path} changed while the kit checked it")
    return fd


def private_root() -> str:
    """Return `root()` after making it if absent and checking it (raises ScratchError when it is not private)."""
    os.close(_open_root(create=True))
    return root()


def started(pid: int) -> int | None:
    """Return when process `pid` started, in clock ticks since boot (/proc/PID/stat), or None if there is no such
    process: with the pid, a name for one process that pid reuse cannot fake. Not psutil's create_time: a step of
    the wall clock changes it between two reads, and a live owner looks dead."""
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
    """Return the live processes of this user (not this one) whose command line or TMPDIR names `path`: what was
    started there (an ipyparallel controller and engines, mpiexec and its daemons) and outlived its owner or its
    stop(). Another user's processes are never returned, whatever their command line says."""
    import psutil
    out = []
    for p in psutil.process_iter(["cmdline", "environ", "status", "uids"]):
        if p.pid == os.getpid() or p.info["status"] == psutil.STATUS_ZOMBIE or not p.info["uids"] \
                or p.info["uids"].real != os.getuid():
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


def _entries(fd: int) -> list[tuple[str, os.stat_result]]:
    """Return (name, lstat) of every real folder this uid owns in the root open at `fd` (links and others' skipped)."""
    out = []
    for name in os.listdir(fd):
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid():
            out.append((name, st))
    return out


def folders() -> list[str]:
    """Return the paths of this user's folders in the root (none if it does not exist)."""
    fd = _open_root(create=False)
    if fd is None:
        return []
    try:
        return [os.path.join(root(), name) for name, _ in _entries(fd)]
    finally:
        os.close(fd)


def _dead_owner(name: str) -> bool:
    """Whether folder `name` (KIND-PID-START-RANDOM) names an owner process that is gone."""
    parts = name.rsplit("-", 3)
    if len(parts) != 4 or not parts[1].isdigit() or not parts[2].isdigit():
        return False
    return _owner_tag(int(parts[1])) != f"{parts[1]}-{parts[2]}"


def sweep() -> list[str]:
    """Remove every scratch folder whose owner process is gone, ending first the processes it left running there
    (a SIGKILLed kernel's controller and engines); return the folders' paths."""
    fd = _open_root(create=False)
    if fd is None:
        return []
    gone = []
    try:
        for name, _ in _entries(fd):
            if _dead_owner(name):
                path = os.path.join(root(), name)
                end(processes_in(path))
                shutil.rmtree(name, dir_fd=fd, ignore_errors=True)     # never follows a link (fd-based)
                gone.append(path)
    finally:
        os.close(fd)
    if gone:
        _remove_root_if_empty(root())     # the dead owner's folder was the last: leave no empty kit-scratch folder
    return gone


def _new_folder(fd: int, prefix: str) -> str:
    """Make a folder PREFIX<random> (mode 0700) in the root open at `fd`; return its name."""
    while True:
        name = prefix + secrets.token_hex(5)
        try:
            os.mkdir(name, 0o700, dir_fd=fd)
            return name
        except FileExistsError:
            continue


def make(kind: str) -> str:
    """Sweep dead owners' folders, then make and return a new private folder for `kind`, owned by this process."""
    if not isinstance(kind, str) or not KIND_RE.fullmatch(kind):
        raise ValueError(f"kind={kind!r}: give a name of letters, digits, '_', '.' and '-' (e.g. 'cluster')")
    sweep()
    for attempt in range(3):
        fd = _open_root(create=True)
        try:
            name = _new_folder(fd, f"{kind}-{_owner_tag(os.getpid())}-")
            made = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:     # another of our processes removed the root, empty, after we opened it
            if attempt == 2:
                raise
            continue
        finally:
            os.close(fd)
        path = os.path.join(root(), name)
        st = os.lstat(path)           # the path names what was made (the root cannot change while it is not empty)
        if (st.st_dev, st.st_ino) != (made.st_dev, made.st_ino):
            raise _refused(f"{root()} changed while the kit made {name} in it")
        return path


def remove(path: str | None, end_processes: bool = False):
    """Remove a scratch folder (and its kit-scratch root, once empty); with `end_processes`, first end every process
    still running there (its command line or TMPDIR in the folder). A link or another user's folder is left alone."""
    if not path:
        _remove_root_if_empty(root())
        return
    if end_processes:
        end(processes_in(path))
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid():
        shutil.rmtree(path, ignore_errors=True)                     # refuses a link; never follows one inside
    _remove_root_if_empty(os.path.dirname(path))


def _remove_root_if_empty(path: str):
    """Remove the kit-scratch root `path` if it is ours, verified, and empty (rmdir fails while anything is in it)."""
    if os.path.basename(path) != f"kit-scratch-{os.getuid()}":
        return
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if problem(path, st) is None:
        try:
            os.rmdir(path)
        except OSError:
            pass


# ----------------------------------------------------------------------------------- ending with the process
_ENDERS: list = []          # what stops this process's clusters and labs (kit.cluster.live, kit.netlab.lab)
_PREVIOUS: dict = {}        # signal -> the handler that was there before ours


def end_with_process(stop) -> bool:
    """Call `stop()` when this process is ended by SIGTERM or SIGHUP, as atexit does at a normal exit (Jupyter's
    shutdown escalation, `timeout` and Slurm's job end send SIGTERM), then the handler that was there before: the
    default one ends the process by that signal again. A signal this process ignores (nohup) stays ignored. Returns
    whether the handlers are in place (only the main thread can install them; elsewhere atexit alone stops)."""
    if stop not in _ENDERS:
        _ENDERS.append(stop)
    if threading.current_thread() is not threading.main_thread():
        return False
    for sig in (signal.SIGTERM, signal.SIGHUP):
        current = signal.getsignal(sig)
        if current is not _on_signal and current is not signal.SIG_IGN:
            _PREVIOUS[sig] = current
            signal.signal(sig, _on_signal)
    return True


def _on_signal(signum, frame):
    for stop in list(_ENDERS):
        with contextlib.suppress(Exception):
            stop()
    previous = _PREVIOUS.get(signum)
    if callable(previous):
        previous(signum, frame)
    elif previous != signal.SIG_IGN:          # the default (or a handler set outside Python): end as it would
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
