"""Every resource the kit takes is bounded, and everything it starts ends with the process that started it (issue 62):
a start of more engines than the machine holds fails at once, a whole start has a time limit, a cluster ends with a
kernel ended by SIGTERM, no server listens on every interface unless asked, every public call checks its arguments,
the engines' compile cache is private, and the suite's temp-dir check counts only what the suite made."""
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

import kit.cluster as kc
from conftest import SUITE_NAMES, descendants, left_by_suite
from kit import scratch
from kit.cluster import checks, launchers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def nothing_starts(monkeypatch):
    """Fail the test if ipyparallel were reached (the arguments must be refused first)."""
    import ipyparallel

    def trap(*a, **k):
        raise AssertionError("something was started before the arguments were checked")
    monkeypatch.setattr(ipyparallel.Cluster, "__init__", trap)


# ----------------------------------------------------------------------------------- 1. a start is bounded
def test_more_engines_than_the_machine_holds_fail_at_once_and_start_nothing(nothing_starts):
    t0 = time.monotonic()
    with pytest.raises(kc.ArgumentError, match=r"n=1000000 is not allowed: at most \d+ engines here \(\d+ cores x 4 "
                                               r"= \d+; .* GiB available / 0.5 GiB per engine = \d+\); "
                                               r"oversubscribe=True starts more anyway.*Nothing was started"):
        kc.start(n=10**6)
    assert time.monotonic() - t0 < 5
    with pytest.raises(kc.ArgumentError, match="n=1000 is not allowed"):      # a typo in a notebook
        kc.start(n=1000, backend="mpi")
    with pytest.raises(AssertionError, match="something was started"):       # asked for: the check lets it through
        kc.start(n=10**6, oversubscribe=True)


def test_the_capacity_is_the_smaller_of_the_cores_and_the_memory():
    gib = 2**30
    checks.check_capacity(8, cores=2, available=64 * gib)                     # 4 per core
    with pytest.raises(kc.ArgumentError, match=r"n=9 .*at most 8 engines"):
        checks.check_capacity(9, cores=2, available=64 * gib)
    checks.check_capacity(3, cores=16, available=int(1.5 * gib))              # 0.5 GiB each
    with pytest.raises(kc.ArgumentError, match=r"n=4 .*at most 3 engines"):
        checks.check_capacity(4, cores=16, available=int(1.5 * gib))


def test_no_engine_is_started_after_the_deadline():
    started = []

    class One:
        def start(self):
            started.append(self)

    class EngineSet:
        launcher_class = One

    class FakeIpp:
        engine_launcher_class = EngineSet

    ipp = FakeIpp()
    launchers.bound(ipp, time.monotonic() + 60)
    ipp.engine_launcher_class.launcher_class().start()
    assert len(started) == 1 and issubclass(ipp.engine_launcher_class, EngineSet)
    launchers.bound(ipp, time.monotonic() - 1)
    with pytest.raises(TimeoutError, match="out of time"):
        ipp.engine_launcher_class.launcher_class().start()
    assert len(started) == 1


@pytest.mark.engines
def test_a_start_that_runs_out_of_time_stops_what_it_started_and_says_how_many_were_up(no_leaks, monkeypatch):
    monkeypatch.setattr(kc.core, "start_limit", lambda timeout: 1.0)
    before = descendants()
    t0 = time.monotonic()
    with pytest.raises(kc.ClusterError, match=r"start: [0-2] of 2 engines were up after 1 s, the limit of a whole "
                                              r"start .*everything it started is stopped"):
        kc.start(n=2, quiet=True)
    assert time.monotonic() - t0 < 30
    assert descendants() <= before


# ----------------------------------------------------------------------------------- 2. it ends with its kernel
HOLDER = """
import json, os, time
import psutil
import kit
c = kit.cluster.start(n=2, quiet=True)
c.view.execute("import os; cache = [os.environ.get(v) for v in ('TORCHINDUCTOR_CACHE_DIR', 'TRITON_CACHE_DIR')]")
print(json.dumps({"pids": [p.pid for p in psutil.Process().children(recursive=True)], "dir": c._dir,
                  "cache": c.view.pull("cache", block=True)}), flush=True)
time.sleep(600)
"""


@pytest.mark.timeout(240)
@pytest.mark.engines
def test_a_process_ended_by_sigterm_stops_its_cluster(no_leaks):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    procs = []
    try:
        info = json.loads(holder.stdout.readline() or "{}")      # the cluster is up
        procs = [psutil.Process(p) for p in info["pids"] if psutil.pid_exists(p)]
        assert len(procs) >= 3                                  # controller and two engines (at least)
        # 6. the engines' compile caches are in their private scratch folder
        assert all(path.startswith(info["dir"] + os.sep) for pair in info["cache"] for path in pair)
        t0 = time.monotonic()
        holder.send_signal(signal.SIGTERM)
        assert holder.wait(timeout=60) == -signal.SIGTERM        # stopped first, then ended by the signal itself
        left = scratch._wait(procs, timeout=5)
        assert not left, f"left running after SIGTERM: {[p.pid for p in left]}"
        assert time.monotonic() - t0 < 20 and not os.path.exists(info["dir"])
    finally:
        holder.kill()
        holder.wait()
        scratch.end(procs)


def test_sigterm_and_sighup_stop_first_then_chain_to_the_handler_before(monkeypatch):
    calls = []
    for sig in (signal.SIGTERM, signal.SIGHUP):
        monkeypatch.setattr(scratch, "_PREVIOUS", {})
        monkeypatch.setattr(scratch, "_ENDERS", [])
        old = signal.signal(sig, lambda s, f: calls.append(("before", s)))
        try:
            assert scratch.end_with_process(lambda: calls.append(("stop", None)))
            assert signal.getsignal(sig) is scratch._on_signal
            os.kill(os.getpid(), sig)
        finally:
            signal.signal(sig, old)
    assert calls == [("stop", None), ("before", signal.SIGTERM), ("stop", None), ("before", signal.SIGHUP)]


def test_an_ignored_hangup_stays_ignored(monkeypatch):
    monkeypatch.setattr(scratch, "_PREVIOUS", {})
    monkeypatch.setattr(scratch, "_ENDERS", [])
    old_hup, old_term = signal.signal(signal.SIGHUP, signal.SIG_IGN), signal.getsignal(signal.SIGTERM)
    try:
        scratch.end_with_process(lambda: None)
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN                 # nohup: the process goes on
        assert signal.getsignal(signal.SIGTERM) is scratch._on_signal
    finally:
        signal.signal(signal.SIGHUP, old_hup)
        signal.signal(signal.SIGTERM, old_term)


# ----------------------------------------------------------------------------------- 3. no wildcard unless asked
@pytest.mark.parametrize("ip", ["0.0.0.0", "::"])
def test_every_interface_is_refused_unless_asked(nothing_starts, ip):
    with pytest.raises(kc.ArgumentError, match=rf"ip='{ip}' is not allowed: an address of this machine.*every "
                                               r"interface and Horovod's Gloo rendezvous has no authentication "
                                               r"\(allow_all_interfaces=True"):
        kc.start(n=2, ip=ip)
    with pytest.raises(AssertionError, match="something was started"):
        kc.start(n=2, ip=ip, allow_all_interfaces=True, oversubscribe=True)


def test_an_address_of_no_interface_here_is_refused(nothing_starts):
    with pytest.raises(kc.ArgumentError, match=r"ip='198.51.100.7' is not allowed: an address of this machine.*"
                                               r"on none of its interfaces"):
        kc.start(n=2, ip="198.51.100.7", oversubscribe=True)
    assert "127.0.0.1" in checks.interface_addresses()


# ----------------------------------------------------------------------------------- 4. arguments at the door
def _standin(state: str = "running"):
    """A Cluster object in `state` with two slots and a client, started by no one: for the checks at the door."""
    c = kc.core.Cluster(n=2, quiet=True, oversubscribe=True)    # (a busy machine's memory: no matter)
    c._state, c._client, c.slots = state, object(), kc.assign_slots({0: "h", 1: "h"})
    return c


def _bench(*argv):
    from kit.bench import main
    return lambda: main(list(argv))


NOFOLDER = os.path.join(tempfile.gettempdir(), f"no-such-folder-{os.getpid()}")    # (the suite's own temp dir)
AT_THE_DOOR = [   # (what is called, the error, the words it must say)
    ("wait(ar, timeout='x')", lambda: _standin().wait(None, timeout="x"), kc.ArgumentError,
     r"cluster.wait: timeout='x' is not allowed: None \(wait until it is done\) or a finite number of seconds >= 0"),
    ("wait(ar, timeout=-1)", lambda: _standin().wait(None, timeout=-1), kc.ArgumentError, "timeout=-1 is not allowed"),
    ("wait(ar, timeout=nan)", lambda: _standin().wait(None, timeout=math.nan), kc.ArgumentError,
     "timeout=nan is not allowed"),
    ("wait(ar, timeout=True)", lambda: _standin().wait(None, timeout=True), kc.ArgumentError,
     "timeout=True is not allowed"),
    ("wait('notanar')", lambda: _standin().wait("notanar"), kc.ArgumentError,
     r"cluster.wait: async_result='notanar' is not allowed: an AsyncResult of this cluster"),
    ("rank_of(99)", lambda: _standin().rank_of(99), kc.ArgumentError,
     r"rank_of: eid=99 is not allowed: one of the engine ids \[0, 1\]"),
    ("engine_of(2)", lambda: _standin().engine_of(2), kc.ArgumentError, "engine_of: rank=2 is not allowed: a rank "
                                                                        "from 0 to 1"),
    ("engine_of('0')", lambda: _standin().engine_of("0"), kc.ArgumentError, "rank='0' is not allowed"),
    ("init_process_group('mpi')", lambda: _standin().init_process_group("mpi"), ValueError,
     "backend='mpi' is not allowed: use 'gloo' or 'nccl'"),
    ("restart() never started", lambda: _standin("new").restart(), kc.ClusterError, "was never started"),
    ("restart() stopped", lambda: _standin("stopped").restart(), kc.ClusterStoppedError, "was stopped"),
    ("--out NOFOLDER/x", _bench("ps", "--tiny", "--out", os.path.join(NOFOLDER, "x")), SystemExit,
     rf"--out: '{NOFOLDER}/x' is in '{NOFOLDER}', which is not a folder: give --mkdir to make it"),
    ("--out a file", _bench("ps", "--out", __file__), SystemExit, "is a file, not a folder"),
]


@pytest.mark.parametrize("call, error, match", [row[1:] for row in AT_THE_DOOR], ids=[row[0] for row in AT_THE_DOOR])
def test_every_public_call_checks_its_arguments_at_the_door(call, error, match, capsys):
    with pytest.raises(error) as e:
        call()
    import re
    assert re.search(match, str(e.value) + capsys.readouterr().err)
    assert type(e.value) not in (TypeError, AttributeError, KeyError, StopIteration)


def test_mkdir_lets_out_make_its_parents(tmp_path):
    from kit.bench import _check_args, _parser
    p = _parser()
    _check_args(p, p.parse_args(["ps", "--out", str(tmp_path / "a" / "b"), "--mkdir"]))    # no error
    _check_args(p, p.parse_args(["ps", "--out", str(tmp_path / "a")]))                      # its parent exists


# ----------------------------------------------------------------------------------- 5. the suite's temp-dir check
def test_the_temp_dir_check_counts_only_names_the_kit_or_its_tools_use(tmp_path, monkeypatch):
    import conftest
    monkeypatch.setattr(conftest, "SYSTEM_TMP", str(tmp_path))
    names = ["tmpab12cd.json", "tmp.Xy3", "kit-scratch-0x", "__autograph_generated_filex.py", "torchinductor_me",
             "kit-test-session-999999999-x"]
    for n in names:
        (tmp_path / n).mkdir()
    assert left_by_suite(set(), set(names)) == ["__autograph_generated_filex.py", "kit-scratch-0x",
                                                 "kit-test-session-999999999-x", "torchinductor_me"]
    assert "kit-*" in SUITE_NAMES


INNER = """
import os, sys
import pytest
pytestmark = pytest.mark.engines      # (not the fast tier's guard: less to import)
def test_the_suite_leaves_one_file_while_another_job_writes_one():
    open(os.path.join(os.environ["SYSTEM_TMP_HERE"], "kit-left-behind"), "w").close()
    print("READY", flush=True)
    sys.stdin.readline()          # the other job writes its file now
"""


@pytest.mark.timeout(200)
@pytest.mark.engines
def test_a_file_another_job_writes_in_the_temp_dir_does_not_fail_the_suite(tmp_path):
    system_tmp = tmp_path / "tmp"
    system_tmp.mkdir(mode=0o700)
    (tmp_path / "test_inner.py").write_text(INNER)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "KIT_SKIP_TMP"))}
    env.update(TMPDIR=str(system_tmp), SYSTEM_TMP_HERE=str(system_tmp),
               PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "tests"), ROOT]))
    plugins = [a for p in ("no:cacheprovider", "no:nbval", "no:xdist", "conftest") for a in ("-p", p)]
    inner = subprocess.Popen([sys.executable, "-m", "pytest", *plugins, "-s", "-q",
                              "-c", os.path.join(ROOT, "pyproject.toml"), str(tmp_path / "test_inner.py")],
                             cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in inner.stdout:
        lines.append(line)
        if "READY" in line:
            (system_tmp / "tmpab12cd.json").write_text("{}")      # another job's file, written while the suite runs
            break
    out = "".join(lines) + inner.communicate("go\n", timeout=150)[0]
    assert "READY" in out, out
    said = [line for line in out.splitlines() if "by the test suite" in line]
    assert said and "kit-left-behind" in said[0] and "tmpab12cd.json" not in said[0], out
    assert inner.returncode == 1


# ----------------------------------------------------------------------------------- 6. the compile cache
def test_the_engines_compile_caches_are_in_their_private_scratch(tmp_path):
    from traitlets.config import Config
    slot = kc.assign_slots({0: "h"})[0]
    env = kc.engine_env(slot, gpus=[], threads=1, timeout=60, folder=str(tmp_path))
    config = Config()
    launchers.set_environment(config, str(tmp_path / "tmp"))
    for where in (env, config.BaseLauncher.environment):          # set on the engine, and when it is started
        assert where["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "tmp" / "torchinductor")
        assert where["TRITON_CACHE_DIR"] == str(tmp_path / "tmp" / "triton")
