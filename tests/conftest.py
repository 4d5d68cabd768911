"""Shared fixtures: every test that starts processes must leave none behind; the suite leaves no temp files."""
import contextlib
import os
import platform
import re
import shutil
import sys
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
    yield from engines_job(3, timeout=60, process_group=True)


def engines_job(n: int, process_group: bool = False, **start):
    """Yield a Gloo cluster of n engines (kit.cluster.start(n, "gloo", quiet=True, **start)) that can import the test
    modules, with a process group if asked; stop it after, and fail if any of its processes is left running (a
    fixture's body: `yield from engines_job(2)`)."""
    before = descendants()
    c = kit.cluster.start(n, "gloo", quiet=True, **start)
    try:
        if process_group:
            c.init_process_group()
        yield importable(c)
    finally:
        c.stop()
        deadline = time.time() + 10
        while (descendants() - before) and time.time() < deadline:
            time.sleep(0.2)
        assert not (descendants() - before), "cluster processes left running"


def find_browser(what: str) -> tuple[str, str]:
    """Return (chromium, chromedriver) for the browser test `what`, or skip (not root) / fail (root, as in CI, where
    `make setup` installs them) saying what to do."""
    import shutil
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    try:
        import selenium  # noqa: F401
        have_selenium = True
    except ImportError:
        have_selenium = False
    missing = [name for name, ok in (("Debian's chromium", chromium), ("chromium-driver (chromedriver)", driver),
                                     ("selenium (pyproject.toml)", have_selenium)) if not ok]
    if missing:
        why = (f"{what} needs {', '.join(missing)}: run `make setup` as root (it apt-installs chromium "
               "chromium-driver and pip-installs selenium into .venv)")
        if is_root():
            pytest.fail(why)
        pytest.skip(why)
    return chromium, driver


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


# ------------------------------------------------------------------ tiers: written in each test file
# `make test` runs every tier this machine can run; `make test-fast` deselects the marked ones (docs/testing.md).
# A test file declares its tier after its imports (`pytestmark = pytest.mark.engines`, or per test where a file
# mixes tiers); a test with none of these markers is in the fast tier, and the guard below proves, by running it,
# that it starts nothing. Only the notebook tier (nbval's cells, collected from notebooks/) is applied here.
TIERS = ("notebook", "browser", "gpu", "lab", "engines")     # registered, with what each means, in pyproject.toml
ROOT_REASON = ("needs root: kit.netlab makes network namespaces, and memory cgroups need root too (CI runs as root; "
               "locally: sudo make test, or Docker with --cap-add NET_ADMIN --cap-add SYS_ADMIN)")


def is_root() -> bool:
    """The one root check of the suite: lab and cgroup tests run as root (CI) and explain themselves otherwise."""
    return os.geteuid() == 0


def pytest_configure(config):
    # The notebooks run every cell at a smoke size under the suite (their parameter cells read it; the committed
    # outputs are the full-size run). `KIT_SMOKE=0 make test` runs them at full size.
    os.environ.setdefault("KIT_SMOKE", "1")


# ------------------------------------------------------------------ the fast tier's guard
class UnmarkedStart(pytest.fail.Exception):
    """A test without a tier marker started a process, a lab or a browser. A pytest failure (a BaseException) so
    that the code under test's `except Exception` cannot swallow it."""


# platform.processor() (which TensorFlow and the kit's machine facts ask) runs `uname -p` once per process and
# caches it: asked here, before any test, so that importing a framework in a fast test starts nothing.
platform.processor()


def tier(item) -> str | None:
    """Return the first tier marker `item` carries (None: the fast tier)."""
    return next((name for name in TIERS if item.get_closest_marker(name)), None)


_DOING: list[str] = []      # what a wrapped kit entry point (kit.cluster.start, kit.netlab.start) is starting


def _refuse(what: str, mark: str = "engines"):
    """Return a stand-in that raises UnmarkedStart for `what` (or for what a wrapped kit call is starting)."""
    def refuse(*args, **kwargs):
        started, fix = (_DOING[-1], ("lab" if "lab" in _DOING[-1] else "engines")) if _DOING else (what, mark)
        cmd = kwargs.get("args", args[1] if what == "a subprocess" and len(args) > 1 else None)
        shown = "" if cmd is None else f" ({(cmd if isinstance(cmd, (str, bytes)) else ' '.join(map(str, cmd)))!s:.80})"
        others = "/".join(t for t in ("engines", "lab", "browser") if t != fix)
        raise UnmarkedStart(f"this test has no tier marker but started {started}{shown}: mark it "
                            f"pytest.mark.{fix} (or {others}; docs/testing.md)")
    return refuse


def _labelled(fn, label: str):
    """Wrap kit entry point `fn` so that a process it starts is reported as `label`."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        _DOING.append(label)
        try:
            return fn(*args, **kwargs)
        finally:
            _DOING.pop()
    wrapper.tier_label = label
    return wrapper


def _guard(mp: pytest.MonkeyPatch):
    """Make every way of starting a process, a lab or a browser raise UnmarkedStart (undone by `mp`)."""
    import importlib
    import multiprocessing.process
    import multiprocessing.util
    import subprocess
    mp.setattr(subprocess.Popen, "__init__", _refuse("a subprocess"))     # run, check_output, os.popen, asyncio
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):  # os.spawn*, pty.fork use os.fork
        if hasattr(os, name):
            mp.setattr(os, name, _refuse(f"a process (os.{name})"))
    mp.setattr(multiprocessing.process.BaseProcess, "start", _refuse("a multiprocessing process"))
    mp.setattr(multiprocessing.util, "spawnv_passfds", _refuse("a multiprocessing helper process"))
    # The rest only names what was started (the refusals above already stop it): a module that does not import
    # (a broken kit module fails its own tests) leaves the others guarded.
    for face, label in (("kit.cluster", "engines (kit.cluster.start)"), ("kit.netlab", "a lab (kit.netlab.start)")):
        try:
            start = importlib.import_module(face).start
        except Exception:
            continue
        for mod in {sys.modules[face], sys.modules.get(start.__module__)} - {None}:  # the face, where it is defined
            if getattr(mod, "start", None) is start:
                mp.setattr(mod, "start", _labelled(start, label))
    with contextlib.suppress(ImportError):
        import ipyparallel
        for name in ("start_controller", "start_engines"):
            mp.setattr(ipyparallel.Cluster, name, _refuse("ipyparallel engines (ipyparallel.Cluster)"))
    with contextlib.suppress(ImportError):
        from selenium.webdriver.remote.webdriver import WebDriver
        mp.setattr(WebDriver, "__init__", _refuse("a browser (selenium webdriver)", "browser"))


@contextlib.contextmanager
def _guarded(item):
    """Run a fast-tier test's setup or call under the guard; a test with a tier runs as it is."""
    if tier(item):
        yield
        return
    with pytest.MonkeyPatch.context() as mp:
        _guard(mp)
        yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    with _guarded(item):        # fixtures too: a module-scoped one that starts engines is set up here
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with _guarded(item):
        return (yield)


UI_TEST = "test_notebook_00_runs_clean_in_jupyterlab"   # runs notebook 00 in JupyterLab, checked cells compared


def _browser_here() -> bool:
    import importlib.util
    return bool((shutil.which("chromium") or shutil.which("chromium-browser")) and shutil.which("chromedriver")
                and importlib.util.find_spec("selenium"))


def pytest_collection_modifyitems(config, items):
    """Mark notebook cells (the notebook tier; nbval's 900 s cell timeout): every other test's tier is written in
    its file. Tests that need root say so and are skipped for a plain user (never in CI, which is root). Notebook
    00 runs once: where the JupyterLab test is selected and can run (or must: root), nbval leaves it to that
    test."""
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
        if item.get_closest_marker("requires_root") and not is_root():
            item.add_marker(pytest.mark.skip(reason=ROOT_REASON))


# ------------------------------------------------------------------ two workers (pytest-xdist)
# `make test` runs on TEST_WORKERS pytest-xdist workers. The unit of work one worker takes is a file: a notebook's
# cells run in order in one kernel, and a module's shared engines (cluster3) or lab serve the whole module. Every
# file with lab tests is one unit together ("lab"), since those tests time shaped links; it goes first (the
# longest), then files and notebooks in collection order.
# (pytest-xdist's own --dist loadgroup cannot do this here: under pytest 9 its xdist_group marks do not reach the
# scheduler, whose node ids it rewrites, so each test of a group went its own way.)
LAB_MARK = re.compile(r"pytest\.mark\.lab\b")     # the controller does not collect: it reads the files' markers


def _lab_files(root: str) -> set[str]:
    """Return the test files that mark any test `lab` (paths relative to `root`)."""
    tests = os.path.dirname(os.path.abspath(__file__))
    return {os.path.relpath(os.path.join(tests, f), root) for f in os.listdir(tests)
            if f.startswith("test_") and f.endswith(".py") and LAB_MARK.search(open(os.path.join(tests, f)).read())}


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
# Every process the suite starts writes in its private TMPDIR (above); what would escape it into the system temp dir
# has one of the names the kit or its tools use there. Only those names are counted, so a file another job or user
# writes there meanwhile (tmp*.json, say) cannot fail the run.
SUITE_NAMES = ("kit-*", "kitlab*", "__autograph_generated_file*", "torchinductor_*", "triton*", "prte.*", "ompi.*",
               "pymp-*", "matplotlib-*", "ipyparallel*", "jupyter*", "horovod*", "scoped_dir*", ".org.chromium.*")


def left_by_suite(before: set[str], now: set[str], session_tmp: str = "") -> list[str]:
    """Return the names new in the system temp dir since `before` that the suite could have made (SUITE_NAMES) and
    this user owns, its own session folder aside."""
    import fnmatch
    return sorted(n for n in now - before if any(fnmatch.fnmatchcase(n, p) for p in SUITE_NAMES)
                  and n != os.path.basename(session_tmp) and _mine(n) and not _in_use(n))


def _in_use(name: str) -> bool:
    """Whether `name` belongs to another live process of this user: another suite's session folder
    (kit-test-session-PID-…), or a kit-scratch root whose folders all have a live owner (kit.scratch names them
    KIND-PID-START-…; this session's processes have ended by now)."""
    from kit import scratch
    if name.startswith("kit-test-session-"):
        pid = name.split("-")[3]
        return pid.isdigit() and int(pid) != os.getpid() and psutil.pid_exists(int(pid))
    if name.startswith("kit-scratch-"):
        try:
            inside = os.listdir(os.path.join(SYSTEM_TMP, name))
        except OSError:
            return False
        return bool(inside) and not any(scratch._dead_owner(f) or f.count("-") < 3
                                        or f.rsplit("-", 3)[1] == str(os.getpid()) for f in inside)
    return False


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
    """Remove the session's temp dir; fail the run if the system temp dir holds anything new of this user's with a
    name the kit or its tools use (left_by_suite; listed by name). KIT_SKIP_TMP_CHECK=1 turns the check off."""
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
    new = left_by_suite(_TMP_BEFORE, set(os.listdir(SYSTEM_TMP)), SESSION_TMP)
    if new:
        session.config.get_terminal_writer().line(
            f"\nleft in {SYSTEM_TMP} by the test suite ({len(new)}): " + ", ".join(new[:40]), red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
