"""Nothing shared is trusted (issue 50), tried as a hostile second user on the same machine would: uid 65534
(`setpriv --reuid=65534`) makes the objects, root (the kit's user in CI) meets them. The kit's scratch root made
first by that user, or a link to a folder of its choosing, is refused with a clear error, never used; a sweep
deletes nothing through a link nor anything of that user's; and JupyterLab's token is on no command line, which
every local user can read.

The hostile objects live in a folder both users can write, made like /tmp (mode 1777) for each test and removed
after it, which the test makes the kit's temp dir."""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import SYSTEM_TMP

from kit import scratch

pytestmark = pytest.mark.engines          # the second user's objects are made by a process running as that user

REPO = Path(__file__).resolve().parent.parent
OTHER = 65534
AS_OTHER = ["setpriv", f"--reuid={OTHER}", f"--regid={OTHER}", "--clear-groups"]


def as_other(script: str):
    """Run shell `script` as uid 65534 (fails the test if it fails)."""
    p = subprocess.run([*AS_OTHER, "sh", "-c", script], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr


@pytest.fixture
def shared_tmp(monkeypatch):
    """A temp dir every user can write, sticky like /tmp, made the kit's temp dir; removed with all in it after."""
    d = tempfile.mkdtemp(prefix="kit-test-shared-", dir=SYSTEM_TMP)
    os.chmod(d, 0o1777)
    monkeypatch.setattr(tempfile, "tempdir", d)
    monkeypatch.setenv("TMPDIR", d)
    yield d
    shutil.rmtree(d)


def tree(path) -> list[str]:
    """Return every path under `path` (links not followed), relative to it."""
    return sorted(os.path.relpath(os.path.join(top, n), path) for top, dirs, files in os.walk(path)
                  for n in dirs + files)


@pytest.mark.requires_root
@pytest.mark.parametrize("mode", ["0700", "0777"])
def test_a_scratch_root_another_user_made_first_is_refused(shared_tmp, mode):
    root = os.path.join(shared_tmp, f"kit-scratch-{os.getuid()}")
    as_other(f"mkdir -m {mode} {root}")
    with pytest.raises(scratch.ScratchError) as e:
        scratch.make("cluster")
    msg = str(e.value)
    assert root in msg and f"belongs to uid {OTHER}" in msg and "set TMPDIR" in msg, msg
    assert os.listdir(root) == [] and os.stat(root).st_uid == OTHER     # nothing made in it, nothing changed


@pytest.mark.requires_root
def test_a_scratch_root_that_is_a_link_is_refused_and_nothing_lands_where_it_points(shared_tmp):
    root, theirs = os.path.join(shared_tmp, f"kit-scratch-{os.getuid()}"), os.path.join(shared_tmp, "theirs")
    as_other(f"mkdir -m 0777 {theirs} && ln -s {theirs} {root}")
    for call in (lambda: scratch.make("cluster"), scratch.private_root):
        with pytest.raises(scratch.ScratchError) as e:
            call()
        assert root in str(e.value) and "symbolic link" in str(e.value) and "set TMPDIR" in str(e.value)
    assert os.listdir(theirs) == [] and os.path.islink(root)


DEAD = "4194303"                       # a pid above Linux's largest: its "owner" is gone, so a sweep takes it


@pytest.mark.requires_root
def test_a_sweep_through_a_linked_root_deletes_none_of_the_folders_it_points_to(shared_tmp):
    """The attack of issue 50: the root a link to a folder of the victim's (root's) own, whose names look like
    dead owners' scratch folders; the old sweep deleted them as root."""
    victim = tempfile.mkdtemp(prefix="kit-test-victim-", dir=SYSTEM_TMP)
    try:
        os.mkdir(os.path.join(victim, f"cluster-{DEAD}-1-abc"))
        open(os.path.join(victim, f"cluster-{DEAD}-1-abc", "work.txt"), "w").close()
        before = tree(victim)
        as_other(f"ln -s {victim} {os.path.join(shared_tmp, f'kit-scratch-{os.getuid()}')}")
        with pytest.raises(scratch.ScratchError, match="symbolic link"):
            scratch.sweep()
        with pytest.raises(scratch.ScratchError, match="symbolic link"):
            scratch.make("cluster")                         # make sweeps first: refused before deleting anything
        assert tree(victim) == before
    finally:
        shutil.rmtree(victim)


@pytest.mark.requires_root
def test_a_sweep_of_a_private_root_skips_links_and_other_users_folders(shared_tmp):
    root = scratch.private_root()
    outside = tempfile.mkdtemp(prefix="kit-test-outside-", dir=SYSTEM_TMP)
    try:
        open(os.path.join(outside, "keep.txt"), "w").close()
        link, theirs, dead = (os.path.join(root, f"{k}-{DEAD}-1-{k}") for k in ("link", "theirs", "dead"))
        os.symlink(outside, link)                            # only root could plant these in a 0700 root of root's,
        os.mkdir(theirs)                                     # but the sweep must not trust its listing either
        os.chown(theirs, OTHER, OTHER)
        os.mkdir(dead)
        swept = scratch.sweep()
        assert swept == [dead] and not os.path.exists(dead)             # a dead owner's folder of ours: removed
        assert os.path.islink(link) and os.listdir(outside) == ["keep.txt"]
        assert os.path.isdir(theirs) and os.stat(theirs).st_uid == OTHER
    finally:
        shutil.rmtree(outside)


@pytest.mark.requires_root
def test_a_scratch_root_with_loose_mode_is_refused_and_a_fresh_one_is_private(shared_tmp):
    path = scratch.make("probe")
    root = scratch.root()
    assert os.stat(root).st_mode & 0o777 == 0o700 and os.stat(path).st_mode & 0o777 == 0o700
    scratch.remove(path)
    assert not os.path.exists(root)                          # removed once empty: nothing left in the temp dir
    os.mkdir(root)
    os.chmod(root, 0o755)
    with pytest.raises(scratch.ScratchError, match="has mode 0755, not 0700"):
        scratch.make("probe")


# ------------------------------------------------------------------------------------ JupyterLab's token
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cmdlines() -> dict[int, str]:
    """Return every process's command line, as any local user reads it from /proc."""
    out = {}
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            out[int(pid)] = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace").replace("\0", " ")
        except OSError:
            pass
    return out


@pytest.mark.timeout(300)
def test_jupyterlab_token_is_on_no_command_line(tmp_path, no_leaks):
    """scripts/lab.sh (what `make lab` runs) hands JupyterLab its token through the environment."""
    port = free_port()
    env = {**os.environ, "VENV": sys.prefix, "LAB_PORT": str(port), "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
           "JUPYTER_DATA_DIR": str(tmp_path / "data"), "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces")}
    env.pop("JUPYTER_TOKEN", None)                           # the script makes one, as `make lab` does
    proc = subprocess.Popen(["bash", str(REPO / "scripts" / "lab.sh")], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, cwd=REPO)
    try:
        line = proc.stdout.readline()
        m = re.search(r"http://127\.0\.0\.1:\d+/lab\?token=(\w+)", line)
        assert m, f"lab.sh printed no URL: {line!r}"
        token = m.group(1)
        deadline, up = time.time() + 240, False
        while not up and time.time() < deadline:
            assert proc.poll() is None, "JupyterLab exited"
            try:
                up = urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=5).status \
                    == 200
            except OSError:
                time.sleep(0.5)
        assert up, "JupyterLab did not answer with the printed token"
        with pytest.raises(urllib.error.HTTPError, match="403"):     # the token is what lets one in
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/contents?token=wrong", timeout=5)
        seen = {pid: c for pid, c in cmdlines().items() if token in c}
        assert not seen, f"the token is on a command line every user can read: {seen}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stdout.close()
