"""Shared fixtures: every test that starts processes must leave none behind; the suite leaves no temp files."""
import atexit
import os
import tempfile
import time

import psutil
import pytest

import kit  # noqa: F401  (sets the framework environment, TF_USE_LEGACY_KERAS=1, before any test imports TF)


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
SYSTEM_TMP = tempfile.gettempdir()
_TMP_BEFORE: set[str] = set()


def pytest_sessionstart(session):
    _TMP_BEFORE.update(os.listdir(SYSTEM_TMP))


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    """Fail the run if the system temp dir holds anything new after the suite (listed by name).

    This process's own exit handlers (TensorFlow removes its autograph files, the kit stops what is still
    running) are run first, as they would be when pytest exits. Another program writing to the same temp dir
    meanwhile shows up here too: run the check alone (CI does)."""
    if os.environ.get("KIT_SKIP_TMP_CHECK") or not _TMP_BEFORE:
        return
    atexit._run_exitfuncs()
    new = sorted(n for n in set(os.listdir(SYSTEM_TMP)) - _TMP_BEFORE if not n.startswith("pytest-of-"))
    if new:
        session.config.get_terminal_writer().line(
            f"\nleft in {SYSTEM_TMP} by the test suite ({len(new)}): " + ", ".join(new[:40]), red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
