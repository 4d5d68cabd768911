"""Which labs exist on this machine and who owns each: names, owner records, lab folders, the sweep of dead
owners' labs.

Every resource of lab L is named `kitlab<L>-...`: namespaces, links, /etc/netns entries, and its folder. A lab
needs root, so only root's word counts, in one place every process on the machine sees whatever its TMPDIR (a
notebook kernel, a shell and `make test` each have their own): /run/kitlab, which must be a real folder owned by
root that no one else can write (checked with lstat each time). It holds each lab's owner record
`kitlab<L>-owner.json` = {pid, start, dir, token, at} and its folder `kitlab<L>-<random>` (mode 0700: keys, the
hosts' HOME and TMPDIR, Slurm's files; a short path, as unix sockets under it need). A record is read only if it is
a regular file of root's (opened without following links), a folder used only if it is a real folder of root's,
mode 0700. Anything else is ignored, never followed or deleted: another user's `/tmp/kitlab<N>-*` folders or
files are not the lab's and cannot block `kit.netlab.start`.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import shutil
import signal
import stat

from kit import scratch
from kit.netlab.system import LabError, run

PREFIX = "kitlab"
NAME_RE = re.compile(rf"^{PREFIX}(\d+)-")
RECORD_RE = re.compile(rf"^{PREFIX}(\d+)-owner\.json$")
MAX_LABS = 64
LOCK = f"/run/{PREFIX}.lock"
OWNERS = f"/run/{PREFIX}"


def names(lab_id: int, hosts: int) -> dict:
    """Return the kernel names and addresses of lab `lab_id` (198.18.<lab_id>.0/24; this machine is .1)."""
    base = f"198.18.{lab_id}"
    return {"bridge": f"{PREFIX}{lab_id}-br", "addr": f"{base}.1",
            "ns": [f"{PREFIX}{lab_id}-h{i}" for i in range(1, hosts + 1)],
            "veth": [f"{PREFIX}{lab_id}-v{i}" for i in range(1, hosts + 1)],
            "host_addr": [f"{base}.{10 + i}" for i in range(1, hosts + 1)]}


# ------------------------------------------------------------------------------------------ root's word only
def root_only(st: os.stat_result) -> bool:
    """Whether an lstat result is owned by root and writable by no one else (not a link: lstat's mode says)."""
    return st.st_uid == 0 and not st.st_mode & 0o022


def owners_dir(create: bool = False) -> str | None:
    """Return OWNERS once checked (a real folder, root's, writable by root only), made 0700 if absent and `create`;
    None if absent. Raise LabError when it is anything else."""
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(OWNERS, 0o700)
    try:
        st = os.lstat(OWNERS)
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(st.st_mode) or not root_only(st):
        raise LabError(f"{OWNERS} is not a folder that only root can write (a link, a file, or mode "
                       f"{stat.S_IMODE(st.st_mode):04o} owned by uid {st.st_uid}): the lab trusts nothing there. "
                       f"Remove it as root (rm -r {OWNERS}) if no lab runs")
    return OWNERS


def record_path(lab_id: int) -> str:
    """Return the path of lab `lab_id`'s owner record."""
    return os.path.join(OWNERS, f"{PREFIX}{lab_id}-owner.json")


def read_record(path: str) -> dict | None:
    """Return an owner record's content if it is a regular file owned by root, writable by root only; else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd) as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or not root_only(st) or st.st_size > 65536:
            return None
        with contextlib.suppress(ValueError):
            record = json.load(f)
            return record if isinstance(record, dict) else None
    return None


def write_record(lab_id: int, record: dict):
    """Write lab `lab_id`'s owner record (0644, root's) into the checked OWNERS folder."""
    owners_dir(create=True)
    path = record_path(lab_id)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)                                   # a dead owner's: gone with its lab, but never reused
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        json.dump(record, f)


def make_dir(lab_id: int) -> str:
    """Make lab `lab_id`'s folder, kitlab<id>-<random> (mode 0700), in the checked OWNERS folder; return its path."""
    owners_dir(create=True)
    fd = os.open(OWNERS, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        if not root_only(os.fstat(fd)):
            raise LabError(f"{OWNERS} changed while the lab checked it: start again")
        while True:
            name = f"{PREFIX}{lab_id}-{secrets.token_hex(4)}"
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o700, dir_fd=fd)
                return os.path.join(OWNERS, name)
    finally:
        os.close(fd)


def lab_dir_ok(path, lab_id: int | None = None) -> bool:
    """Whether `path` is a lab folder to trust: OWNERS/kitlab<id>-..., a real folder of root's, mode 0700."""
    if not isinstance(path, str) or os.path.dirname(path) != OWNERS:
        return False
    m = NAME_RE.match(os.path.basename(path))
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return bool(m and (lab_id is None or int(m.group(1)) == lab_id) and scratch.problem(path, st, 0) is None)


@contextlib.contextmanager
def lock():
    """Hold the machine-wide lock under which labs get their numbers (two starts must not pick the same one)."""
    fd = os.open(LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        if not root_only(os.fstat(fd)):
            raise LabError(f"{LOCK} is not root's: remove it as root (rm {LOCK})")
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------------------ what exists
def _kit_resources() -> dict[int, dict[str, list[str]]]:
    """Return every kitlab resource on this machine, by lab number: namespaces, links, /etc/netns dirs, lab folders
    ("tmp") and owner records."""
    found: dict[int, dict[str, list[str]]] = {}

    def add(kind, name, key=None):
        m = NAME_RE.match(key or name)
        if m:
            found.setdefault(int(m.group(1)), {}).setdefault(kind, []).append(name)
    for line in run("ip", "netns", "list").stdout.splitlines():
        add("ns", line.split()[0])
    for line in run("ip", "-o", "link", "show").stdout.splitlines():
        add("link", line.split(":")[1].strip().split("@")[0])
    for d in sorted(os.listdir("/etc/netns")) if os.path.isdir("/etc/netns") else []:
        add("etc", os.path.join("/etc/netns", d), d)
    if owners_dir():
        for name in sorted(os.listdir(OWNERS)):
            path = os.path.join(OWNERS, name)
            if RECORD_RE.match(name) and read_record(path) is not None:
                add("owner", path, name)
            elif lab_dir_ok(path):
                add("tmp", path, name)
            # anything else (not root's, a link) is ignored: never removed, never counted
    return found


def live_owner(res: dict[str, list[str]]) -> int | None:
    """Return the pid of the process that made this lab if it still runs (same pid AND same start time), from its
    record in OWNERS; else None."""
    for path in res.get("owner", []):
        record = read_record(path) or {}
        with contextlib.suppress(KeyError, TypeError, ValueError):
            if scratch.started(int(record["pid"])) == int(record["start"]):
                return int(record["pid"])
    return None


def _kill_all(pids: set[int], sig=signal.SIGKILL):
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def ns_pids(ns: str) -> set[int]:
    """Return the pids of the processes living in network namespace `ns`."""
    return {int(p) for p in run("ip", "netns", "pids", ns, check=False).stdout.split()}


def _cmdline_has(pid: str, text: str) -> bool:
    try:
        return text.encode() in open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        return False


def _roots(pid: str) -> bool:
    """Whether process `pid` runs as root (a lab's processes do; another user's are never killed for naming a lab)."""
    try:
        return os.stat(f"/proc/{pid}").st_uid == 0
    except OSError:
        return False


def _remove(res: dict[str, list[str]]):
    """Remove one lab's resources: kill what runs in its namespaces, delete namespaces, links, dirs, its record."""
    for ns in res.get("ns", []):
        _kill_all(ns_pids(ns))
    for tmp in res.get("tmp", []):          # sshd of a lab whose namespace is already gone
        _kill_all({int(p) for p in os.listdir("/proc") if p.isdigit() and _roots(p) and _cmdline_has(p, tmp)})
    for ns in res.get("ns", []):
        run("ip", "netns", "del", ns, check=False)
    for link in res.get("link", []):
        run("ip", "link", "del", link, check=False)
    for d in res.get("etc", []):
        shutil.rmtree(d, ignore_errors=True)
    for d in res.get("tmp", []):
        if lab_dir_ok(d):
            shutil.rmtree(d, ignore_errors=True)       # a real folder of root's; never follows a link inside
    for record in res.get("owner", []):
        with contextlib.suppress(FileNotFoundError):
            os.remove(record)


def sweep() -> list[int]:
    """Remove every lab whose owner process is gone (a crashed kernel); return their numbers."""
    stale = [i for i, res in _kit_resources().items() if live_owner(res) is None]
    for i in stale:
        _remove(_kit_resources().get(i, {}))
    return stale
