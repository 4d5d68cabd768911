"""The test tiers (tests/conftest.py, docs/testing.md): a test without a tier marker runs under a guard that refuses
to start a process, engines, a lab or a browser, and says which marker the test needs; a marked test is not
guarded; markers are strict. These tests are themselves fast-tier tests, so the guard they see is the real one."""
import multiprocessing
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import conftest
from conftest import UnmarkedStart

REPO = Path(__file__).resolve().parents[1]
NEEDS = "this test has no tier marker but started"


def test_a_subprocess_is_refused_naming_the_command_and_the_marker():
    with pytest.raises(UnmarkedStart, match=rf"{NEEDS} a subprocess \(.* -c pass\): mark it pytest\.mark\.engines"):
        subprocess.run([sys.executable, "-c", "pass"], check=True)
    with pytest.raises(UnmarkedStart, match=rf"{NEEDS} a subprocess \(true\)"):
        subprocess.check_output("true", shell=True)
    with pytest.raises(UnmarkedStart):
        os.popen("true")


def test_code_that_catches_every_exception_cannot_swallow_the_refusal():
    def careless():
        try:
            subprocess.run(["true"])
        except Exception:                   # what a "best effort" helper in the code under test might do
            return "swallowed"
    with pytest.raises(UnmarkedStart):
        careless()


def test_fork_spawn_system_and_multiprocessing_are_refused():
    assert os.fork.__name__ == "refuse", "os.fork is not guarded"    # else the call below would fork pytest
    with pytest.raises(UnmarkedStart, match=rf"{NEEDS} a process \(os\.fork\)"):
        os.fork()
    with pytest.raises(UnmarkedStart, match=r"os\.posix_spawn"):
        os.posix_spawn("/bin/true", ["true"], dict(os.environ))
    with pytest.raises(UnmarkedStart, match=r"os\.system"):
        os.system("true")
    with pytest.raises(UnmarkedStart, match=rf"{NEEDS} a multiprocessing process"):
        multiprocessing.Process(target=int).start()


def test_engines_are_refused_as_engines():
    import ipyparallel as ipp
    with pytest.raises(UnmarkedStart, match=rf"{NEEDS} ipyparallel engines .*: mark it pytest\.mark\.engines"):
        ipp.Cluster(n=1).start_cluster_sync()


@pytest.mark.parametrize("module, label, marker", [
    ("kit.cluster", "engines (kit.cluster.start)", "engines"),
    ("kit.netlab", "a lab (kit.netlab.start)", "lab"),
])
def test_what_kit_start_starts_is_named_by_the_entry_point(module, label, marker):
    """kit.cluster.start and kit.netlab.start check their arguments first (fast tests call them with bad ones);
    a process they then start is named after them, with the marker the test needs."""
    import importlib
    mod = importlib.import_module(module)
    assert mod.start.tier_label == label                # the guard wrapped the entry point for this test
    with pytest.raises(UnmarkedStart, match=rf"{NEEDS} {re.escape(label)} \(true\): mark it pytest\.mark\.{marker} "):
        conftest._labelled(lambda: subprocess.run(["true"]), label)()


def test_a_browser_is_refused_as_a_browser():
    from selenium.webdriver.remote.webdriver import WebDriver       # installed by make setup
    with pytest.raises(UnmarkedStart, match=rf"{NEEDS} a browser .*: mark it pytest\.mark\.browser"):
        WebDriver(command_executor="http://127.0.0.1:9")


def test_in_process_work_is_not_refused(tmp_path):
    """Threads, temp files, imports and sockets are not processes: a fast test may use them."""
    import importlib
    import socket
    import threading
    out = []
    t = threading.Thread(target=out.append, args=(1,))
    t.start()
    t.join()
    (tmp_path / "f").write_text("x")
    importlib.import_module("json")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
    assert out == [1] and (tmp_path / "f").read_text() == "x"


@pytest.mark.engines
def test_a_marked_test_is_not_guarded():
    """A real subprocess, after the fast tests above: marked tests run as they are, and the guard is undone."""
    assert subprocess.Popen.__init__.__module__ == "subprocess"
    assert subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True, text=True,
                          timeout=60).stdout == "42\n"


def test_markers_are_strict_and_every_tier_is_registered():
    ini = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "--strict-markers" in ini["addopts"].split()
    registered = [m.split(":")[0] for m in ini["markers"]]
    assert registered == [*conftest.TIERS, "requires_root"]



def test_the_testing_page_maps_every_test_file():
    """docs/testing.md's table names every test file (and none that is gone), so a reader finds what each tests."""
    rows = re.findall(r"^\| `((?:gpu/)?test_\w+\.py)` \|", (REPO / "docs" / "testing.md").read_text(), re.M)
    files = sorted(str(p.relative_to(REPO / "tests")) for p in (REPO / "tests").rglob("test_*.py"))
    missing, gone = sorted(set(files) - set(rows)), sorted(set(rows) - set(files))
    assert not missing and not gone, (f"docs/testing.md's table of test files lacks {missing} (add a row: the file, "
                                      f"what it tests, its tiers) and names files that are gone: {gone}")
