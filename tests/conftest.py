"""Shared fixtures: every test that starts processes must leave none behind; the suite leaves no temp files."""
import inspect
import os
import re
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
# Under pytest-xdist (`make test` runs two workers) the controller makes the folder and its workers share it: it
# is removed, and the system temp dir checked, once, by the controller.
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
SYSTEM_TMP = tempfile.gettempdir()
if XDIST_WORKER and os.path.basename(SYSTEM_TMP).startswith("kit-test-session-"):
    SESSION_TMP, SYSTEM_TMP = SYSTEM_TMP, os.path.dirname(SYSTEM_TMP)
else:
    XDIST_WORKER = None
# A session that crashed (SIGSEGV, SIGKILL) could not remove its folder: the next one does.
for _old in os.listdir(SYSTEM_TMP) if not XDIST_WORKER else ():
    _parts = _old.split("-")
    if _old.startswith("kit-test-session-") and len(_parts) > 4 and _parts[3].isdigit() \
            and not psutil.pid_exists(int(_parts[3])) and os.stat(os.path.join(SYSTEM_TMP, _old)).st_uid == os.getuid():
        shutil.rmtree(os.path.join(SYSTEM_TMP, _old), ignore_errors=True)
if not XDIST_WORKER:
    SESSION_TMP = tempfile.mkdtemp(prefix=f"kit-test-session-{os.getpid()}-", dir=SYSTEM_TMP)
os.environ["TMPDIR"] = SESSION_TMP
tempfile.tempdir = SESSION_TMP

import kit  # noqa: E402  (sets the framework environment, TF_USE_LEGACY_KERAS=1, before any test imports TF)


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


@pytest.fixture(scope="module")
def cluster3():
    """One Gloo job of 3 engines (a ring where left != right) with a process group, shared by a module's engine
    tests, which it lets import the test modules; nothing of it is left running afterwards."""
    before = descendants()
    c = kit.cluster.start(n=3, backend="gloo", timeout=60, quiet=True)
    try:
        c.init_process_group()
        importable(c)
        yield c
    finally:
        c.stop()
        deadline = time.time() + 10
        while (descendants() - before) and time.time() < deadline:
            time.sleep(0.2)
        assert not (descendants() - before), "cluster processes left running"


# ------------------------------------------------------------------ lab leftovers (test_netlab, test_slurm_lab)
def lab_process(pid: str) -> bool:
    """Whether /proc/PID is a live (not zombie) process of a kit lab (its command line names a /kitlab folder)."""
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
        return state != "Z" and b"/kitlab" in open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        return False


def lab_leftovers() -> dict[str, list]:
    """Return every kit lab resource on this machine but those of labs another live process (not this one or its
    children) owns: namespaces, links, /etc/netns and temp dirs, owner records, and the labs' processes."""
    from kit.netlab import registry as lab
    procs = [p for p in os.listdir("/proc") if p.isdigit() and lab_process(p)]
    res = lab._kit_resources() if is_root() else {}
    mine = {os.getpid()} | descendants()     # a lab's owner record is written first and removed last
    foreign = {n for n, r in res.items() if lab.live_owner(r) not in (None, *mine)}
    dirs = [d for n in foreign for d in res[n].get("tmp", [])]
    procs = [p for p in procs if not any(lab._cmdline_has(p, d) for d in dirs)]
    return {"resources": sorted(i for i in res.items() if i[0] not in foreign), "processes": procs}


# ------------------------------------------------------------------ tiers: markers from what a test uses
# `make test` runs every tier this machine can run; `make test-fast` deselects the marked ones (docs/testing.md).
TIERS = {
    "notebook": "a notebook cell run by nbval",
    "browser": "drives JupyterLab in headless Chromium (selenium)",
    "gpu": "needs an NVIDIA GPU (tests/gpu, make test-gpu)",
    "lab": "emulated hosts: kit.netlab's network namespaces (root)",
    "engines": "starts engines, a Horovod/MPI/torch.distributed job or a benchmark run (seconds to minutes)",
}
# What in a test's source (or its fixtures') puts it in a tier; checked in this order, a test gets every match.
USES = {
    "browser": re.compile(r"selenium|webdriver|chromedriver"),
    "lab": re.compile(r"netlab\.start|\blab_fixture\b|\bwith_lab\b|kit\.bench network|run_on_lab"),
    "engines": re.compile(r"\bstart\(|ipp\.Cluster|horovodrun|mpirun|mpiexec|run_script|bench\.main|\"kit\.bench\"|"
                          r"Popen|subprocess\.run|spawn|no_leaks|cluster\d?\b|launch\("),
}
ROOT_REASON = ("needs root: kit.netlab makes network namespaces, and memory cgroups need root too (CI runs as root; "
               "locally: sudo make test, or Docker with --cap-add NET_ADMIN --cap-add SYS_ADMIN)")


def is_root() -> bool:
    """The one root check of the suite: lab and cgroup tests run as root (CI) and explain themselves otherwise."""
    return os.geteuid() == 0


def pytest_configure(config):
    # The notebooks run every cell at a smoke size under the suite (their parameter cells read it; the committed
    # outputs are the full-size run). `KIT_SMOKE=0 make test` runs them at full size.
    os.environ.setdefault("KIT_SMOKE", "1")
    for name, what in TIERS.items():
        config.addinivalue_line("markers", f"{name}: {what}")
    config.addinivalue_line("markers", f"requires_root: {ROOT_REASON}")


def _source(obj) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


def _uses(item) -> str:
    """The source of a test function and of every fixture it uses (directly or through other fixtures)."""
    parts = [_source(getattr(item, "function", None))]
    for defs in getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {}).values():
        parts += [_source(d.func) for d in defs if not d.func.__module__.startswith(("_pytest", "pytest"))]
    return "\n".join(parts)


UI_TEST = "test_notebook_00_runs_clean_in_jupyterlab"   # runs notebook 00 in JupyterLab, checked cells compared


def _browser_here() -> bool:
    import importlib.util
    return bool((shutil.which("chromium") or shutil.which("chromium-browser")) and shutil.which("chromedriver")
                and importlib.util.find_spec("selenium"))


def pytest_collection_modifyitems(config, items):
    """Mark each test with its tiers (from what it uses); notebook cells get nbval's 900 s cell timeout; tests that
    need root say so and are skipped for a plain user (never in CI, which is root). Notebook 00 runs once: where
    the JupyterLab test is selected and can run (or must: root), nbval leaves it to that test."""
    if any(item.name == UI_TEST for item in items) and (_browser_here() or is_root()):
        nb00 = [item for item in items if type(item).__name__ == "IPyNbCell"
                and item.path.name == "00_environment.ipynb"]
        if nb00:
            config.hook.pytest_deselected(items=nb00)
            items[:] = [item for item in items if item not in nb00]
    for item in items:
        if type(item).__name__ == "IPyNbCell":
            item.add_marker(pytest.mark.notebook)
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(900))
            continue
        if "tests/gpu/" in str(item.path).replace(os.sep, "/"):
            item.add_marker(pytest.mark.gpu)
        text = _uses(item)
        for tier, pattern in USES.items():
            if pattern.search(text) and not item.get_closest_marker(tier):
                item.add_marker(getattr(pytest.mark, tier))
        if item.get_closest_marker("requires_root") and not is_root():
            item.add_marker(pytest.mark.skip(reason=ROOT_REASON))


# ------------------------------------------------------------------ two workers (pytest-xdist)
# `make test` runs on TEST_WORKERS pytest-xdist workers. The unit of work one worker takes is a file: a notebook's
# cells run in order in one kernel, and a module's shared engines (cluster3) or lab serve the whole module. Every
# file with lab tests is one unit together ("lab"), since those tests time shaped links; it goes first (the
# longest), then files and notebooks in collection order.
# (pytest-xdist's own --dist loadgroup cannot do this here: under pytest 9 its xdist_group marks do not reach the
# scheduler, whose node ids it rewrites, so each test of a group went its own way.)
def _lab_files(root: str) -> set[str]:
    tests = os.path.dirname(os.path.abspath(__file__))
    return {os.path.relpath(os.path.join(tests, f), root) for f in os.listdir(tests)
            if f.startswith("test_") and f.endswith(".py") and USES["lab"].search(open(os.path.join(tests, f)).read())}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    lab_files = _lab_files(str(config.rootpath))

    class ByFile(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "lab" if path in lab_files else path

        def _assign_work_unit(self, node):
            if "lab" in self.workqueue:
                self.workqueue.move_to_end("lab", last=False)
            super()._assign_work_unit(node)

    return ByFile(config, log)


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


def _stray_processes(grace: float = 10) -> list[str]:
    """End and return ('pid: command line') every process still running in the session's temp dir (its TMPDIR or
    command line in it): one a test left behind, orphaned or not (pytest-xdist's workers have exited by now)."""
    from kit import scratch
    deadline = time.time() + grace                 # a process ending as the session ends is not left behind
    while (procs := scratch.processes_in(SESSION_TMP)) and time.time() < deadline:
        time.sleep(0.5)
    lines = [f"{p.pid}: {' '.join(p.info['cmdline'] or [])[:200]}" for p in procs]
    scratch.end(procs)
    return lines


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    """Remove the session's temp dir; fail the run if the system temp dir holds anything new of this user's
    (listed by name).

    Another program of the same user writing to the same temp dir meanwhile shows up here too: run the check alone
    (CI does), or set KIT_SKIP_TMP_CHECK=1 on a shared machine."""
    if XDIST_WORKER:
        return
    stray = _stray_processes()
    if stray:
        session.config.get_terminal_writer().line(
            f"\nleft running by the test suite ({len(stray)}; ended now):\n" + "\n".join(stray), red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
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
