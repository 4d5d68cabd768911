"""Shared fixtures: every test that starts processes must leave none behind; the suite leaves no temp files."""
import os
import shutil
import tempfile
import time

import psutil
import pytest

# ------------------------------------------------------------------ the suite's own temp dir
# Every process the suite starts (nbval's kernels, engines, labs, servers) inherits TMPDIR: one folder for the
# session, removed at its end. Notebook kernels are killed by nbval, so TensorFlow's exit handler never removes
# their __autograph_generated_file*.py; this keeps them (and anything else a killed process leaves) out of the
# system temp dir. What escapes it (a hard-coded /tmp path) is still caught by the check below; the kit's own
# clean-up (one scratch folder per cluster, swept after SIGKILL) is tested directly in tests/test_cleanup.py.
SYSTEM_TMP = tempfile.gettempdir()
for _old in os.listdir(SYSTEM_TMP):      # a session that crashed (SIGSEGV, SIGKILL) could not remove its folder
    _parts = _old.split("-")
    if _old.startswith("kit-test-session-") and len(_parts) > 4 and _parts[3].isdigit() \
            and not psutil.pid_exists(int(_parts[3])) and os.stat(os.path.join(SYSTEM_TMP, _old)).st_uid == os.getuid():
        shutil.rmtree(os.path.join(SYSTEM_TMP, _old), ignore_errors=True)
SESSION_TMP = tempfile.mkdtemp(prefix=f"kit-test-session-{os.getpid()}-", dir=SYSTEM_TMP)
os.environ["TMPDIR"] = SESSION_TMP
tempfile.tempdir = SESSION_TMP

import kit  # noqa: E402,F401  (sets the framework environment, TF_USE_LEGACY_KERAS=1, before any test imports TF)


def descendants() -> set[int]:
    """Return the pids of every live process below this one."""
    out = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                out.add(p.pid)
        except psutil.Error:
            pass
    return out


def importable(cluster):
    """Let the cluster's engines import the test modules (ipyparallel sends a function by reference to its module)."""
    cluster.view.execute(f"import sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})",
                         block=True)
    return cluster


@pytest.fixture
def no_leaks():
    """Fail the test if it leaves a process of its own running (after a few seconds' grace)."""
    before = descendants()
    yield
    deadline = time.time() + 10
    while (left := descendants() - before) and time.time() < deadline:
        time.sleep(0.2)
    names = []
    for pid in left:
        try:
            names.append(f"{pid}: {' '.join(psutil.Process(pid).cmdline())[:120]}")
        except psutil.Error:
            pass
    assert not names, "processes left running:\n" + "\n".join(names)


def pytest_collection_modifyitems(items):
    """Notebook cells (nbval) get the cell timeout `make test` gives nbval (900 s), not the per-test default."""
    for item in items:
        if type(item).__name__ == "IPyNbCell" and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(900))


# ------------------------------------------------------------------ nothing left in the system temp dir
_TMP_BEFORE: set[str] = set()


def pytest_sessionstart(session):
    _TMP_BEFORE.update(os.listdir(SYSTEM_TMP))


def _mine(name: str) -> bool:
    """Whether this user owns `name` in the system temp dir (another user's suite, run beside, is not ours)."""
    try:
        return os.lstat(os.path.join(SYSTEM_TMP, name)).st_uid == os.getuid()
    except FileNotFoundError:
        return False


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    """Remove the session's temp dir; fail the run if the system temp dir holds anything new of this user's
    (listed by name).

    Another program of the same user writing to the same temp dir meanwhile shows up here too: run the check alone
    (CI does), or set KIT_SKIP_TMP_CHECK=1 on a shared machine."""
    left = sum(len(files) + len(dirs) for _, dirs, files in os.walk(SESSION_TMP))
    shutil.rmtree(SESSION_TMP, ignore_errors=True)
    session.config.get_terminal_writer().line(f"\nremoved the suite's temp dir ({left} entries left in it)")
    if os.environ.get("KIT_SKIP_TMP_CHECK") or not _TMP_BEFORE:
        return
    new = sorted(n for n in set(os.listdir(SYSTEM_TMP)) - _TMP_BEFORE
                 if not n.startswith("pytest-of-") and os.path.join(SYSTEM_TMP, n) != SESSION_TMP and _mine(n))
    if new:
        session.config.get_terminal_writer().line(
            f"\nleft in {SYSTEM_TMP} by the test suite ({len(new)}): " + ", ".join(new[:40]), red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
