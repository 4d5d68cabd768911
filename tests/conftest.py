"""Shared fixtures: every test that starts processes must leave none behind."""
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
