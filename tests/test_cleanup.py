"""Clean temp (issue 15, point 4): each cluster writes under its own scratch folder, removed on stop, swept after
its owner was SIGKILLed; TensorFlow's autograph files from the engines land there too."""
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest
from ipyparallel import interactive

import kit.cluster as kc
from kit import scratch


def test_scratch_folders_live_under_one_kit_folder_in_the_system_temp_dir():
    path = scratch.make("probe")
    try:
        assert os.path.dirname(path) == scratch.root()
        assert os.path.dirname(scratch.root()) == tempfile.gettempdir()
        assert os.path.basename(path).startswith(f"probe-{os.getpid()}-")
    finally:
        scratch.remove(path)
    assert not os.path.exists(path)


@pytest.mark.engines
def test_end_stops_what_runs_and_counts_a_zombie_as_ended():
    """A zombie has exited; only its parent can reap it (an orphaned engine nanny's is the machine's init, which
    may take seconds). scratch.end must not wait for that: a cluster's stop waited ~2 s per stop before."""
    import psutil
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        zombie = psutil.Process(dead.pid)
        deadline = time.monotonic() + 60
        while zombie.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.05)                                  # exited, not yet reaped by us (its parent)
        assert scratch._wait([zombie, psutil.Process(running.pid)], timeout=0) == [psutil.Process(running.pid)]
        scratch.end([zombie, psutil.Process(running.pid)], grace=30)
        assert running.wait(timeout=5) == -signal.SIGTERM and dead.wait(timeout=5) == 0
    finally:
        running.kill()
        running.wait()
        dead.wait()


@pytest.mark.engines
def test_a_folder_whose_owner_was_sigkilled_is_swept_by_the_next_make():
    code = "import os, signal, kit.scratch as s; p = s.make('cluster'); print(p, flush=True); " \
           "open(os.path.join(p, 'left.txt'), 'w').close(); os.kill(os.getpid(), signal.SIGKILL)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == -signal.SIGKILL
    left = out.stdout.strip()
    assert os.path.exists(os.path.join(left, "left.txt"))     # the owner died: nothing removed it
    mine = scratch.make("cluster")
    try:
        assert not os.path.exists(left)                       # the next make swept it
        assert os.path.exists(mine)                           # and kept its own
    finally:
        scratch.remove(mine)


@pytest.mark.engines
def test_sweeping_the_last_dead_owners_folder_removes_the_empty_root(tmp_path, monkeypatch):
    """A sweep that empties the root removes it too, as remove() does: no empty kit-scratch folder is left."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))              # a root of our own, nobody else's folders
    code = "import os, signal, kit.scratch as s; print(s.make('train'), flush=True); os.kill(os.getpid(), 9)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TMPDIR": str(tmp_path)})
    left = out.stdout.strip()
    assert out.returncode == -signal.SIGKILL and os.path.dirname(left) == scratch.root()
    assert scratch.sweep() == [left]
    assert not os.path.exists(scratch.root())


def test_make_retries_when_another_process_removed_the_empty_root_under_it(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    real, calls = scratch._new_folder, []

    def new_folder(fd, prefix):
        calls.append(prefix)
        if len(calls) == 1:
            os.rmdir(scratch.root())                # another process's remove(), after make opened the root
        return real(fd, prefix)
    monkeypatch.setattr(scratch, "_new_folder", new_folder)
    path = scratch.make("probe")
    assert len(calls) == 2 and os.path.isdir(path) and os.path.dirname(path) == scratch.root()
    scratch.remove(path)
    assert not os.path.exists(scratch.root())


@pytest.mark.engines
@pytest.mark.timeout(300)
def test_a_sigkilled_kernels_controller_and_engines_are_ended_by_the_next_start(no_leaks):
    """A kernel SIGKILLed with a cluster up (nbval's kill, a crash) leaves its controller and engines running under
    init; the next kit.cluster start in any process ends them with the dead owner's folder."""
    import psutil
    code = ("import os, signal, kit.cluster as kc; c = kc.start(2, 'gloo', quiet=True); print(c._dir, flush=True); "
            "os.kill(os.getpid(), signal.SIGKILL)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert out.returncode == -signal.SIGKILL, out.stderr[-2000:]
    folder = out.stdout.strip()
    left = scratch.processes_in(folder)
    assert len(left) >= 3, [p.cmdline() for p in left]             # the controller and two engines outlived it
    mine = scratch.make("cluster")
    try:
        _, alive = psutil.wait_procs(left, timeout=10)
        assert not alive and not os.path.exists(folder)
    finally:
        scratch.remove(mine)


@interactive          # sent by value: the engine cannot import this test module
def _autograph_files():
    import glob
    import os
    import tempfile
    import tensorflow as tf

    @tf.function
    def absolute(x):
        if x > 0:          # autograph converts this `if`: it writes a generated file
            return x
        return -x
    absolute(tf.constant(-1.0))
    tmp = tempfile.gettempdir()
    return tmp, os.environ.get("TMPDIR"), glob.glob(os.path.join(tmp, "__autograph_generated_file*"))


@pytest.mark.engines
@pytest.mark.timeout(600)   # starts an engine that imports TensorFlow: minutes on a busy 2-core machine
def test_engines_temp_files_land_in_the_clusters_folder_and_go_with_it(no_leaks):
    with kc.start(1, "gloo", quiet=True) as c:
        folder = c._dir
        (tmp, env_tmp, files), = c.view.apply_sync(_autograph_files)
        assert tmp == env_tmp == os.path.join(folder, "tmp")
        assert files and all(f.startswith(tmp) for f in files)
        # a process of the cluster's that stop()'s list of processes cannot hold (started after it, orphaned)
        late = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                                env=dict(os.environ, TMPDIR=tmp), start_new_session=True)
    try:
        assert late.wait(timeout=30) is not None      # ended by stop(): it ran in the cluster's folder
    finally:
        late.kill()
    assert not os.path.exists(folder)
