"""kit.netlab: emulated hosts on one machine. Life cycle and leaks, link rates, cut/restore, the sweep after a
crash, security (listening sockets, keys), and horovodrun / mpiexec across two lab hosts, killed and resumed.

These need root (network namespaces). CI runs as root, so there they always run; as root, a missing tool (sshd,
ip, tc) FAILS with the package to install. Without root they are skipped, except the test of the error itself.
"""
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from conftest import is_root, lab_process
from conftest import lab_leftovers as leftovers

from kit import mnist, netlab
from kit.mnist.train import STALLED
from kit.netlab import ssh as netlab_ssh

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SCRIPT = str(REPO / "scripts" / "train_keras_mnist.py")
TINY = ["--dataset", "digits", "--train-samples", "512", "--batch-size", "32", "--threads", "1"]
needs_root = pytest.mark.requires_root
CHILD_ENV = dict(os.environ, PYTHONPATH=str(REPO))
pytestmark = [pytest.mark.lab, pytest.mark.engines]      # labs, and the jobs and probes they run


def assert_clean():
    deadline = time.time() + 10
    while (left := leftovers()) != {"resources": [], "processes": []} and time.time() < deadline:
        time.sleep(0.2)
    assert left == {"resources": [], "processes": []}, f"left behind: {left}"


def ssh_home_state():
    d = Path.home() / ".ssh"
    return sorted((p.name, p.stat().st_mtime) for p in d.iterdir()) if d.exists() else None


# --------------------------------------------------------------------------------------- requirements
@pytest.mark.timeout(60)
@pytest.mark.engines
def test_without_root_start_says_what_to_do():
    code = "import kit.netlab as n\ntry:\n    n.start(2)\nexcept n.LabError as e:\n    print(e)"
    # as root: the same call from a root process without CAP_NET_ADMIN (Docker without --cap-add NET_ADMIN)
    prefix = ["setpriv", "--bounding-set", "-net_admin"] if is_root() else []
    p = subprocess.run([*prefix, sys.executable, "-c", code], capture_output=True, text=True, env=CHILD_ENV,
                       timeout=60)
    assert "needs root" in p.stdout and "--cap-add NET_ADMIN" in p.stdout, p.stdout + p.stderr


@pytest.mark.engines
def test_why_not_gives_the_reason_a_notebook_shows_instead_of_raising():
    # what notebooks 02-04's lab cells call: None where a lab can start, else the LabError's sentence, never a raise
    code = "import kit.netlab as n\nprint(repr(n.why_not()))"
    prefix = ["setpriv", "--bounding-set", "-net_admin"] if is_root() else []
    p = subprocess.run([*prefix, sys.executable, "-c", code], capture_output=True, text=True, env=CHILD_ENV,
                       timeout=60)
    assert p.returncode == 0 and "needs root" in p.stdout and "--cap-add NET_ADMIN" in p.stdout, p.stdout + p.stderr
    if is_root():
        assert netlab.why_not() is None       # CI: root with NET_ADMIN and every tool


@needs_root
@pytest.mark.timeout(30)
def test_root_has_every_tool_the_lab_needs():
    netlab.check_requirements()          # raises LabError naming the Debian package of a missing tool


@needs_root
@pytest.mark.timeout(30)
@pytest.mark.lab
@pytest.mark.engines
def test_without_sshd_the_error_names_the_package(monkeypatch, tmp_path):
    for tool in ("ip", "tc", "unshare", "ssh", "ssh-keygen"):      # every other tool, but no sshd
        (tmp_path / tool).symlink_to(shutil.which(tool))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(netlab_ssh, "SSHD_PATHS", (str(tmp_path / "sshd"),))
    with pytest.raises(netlab.LabError, match="apt-get install -y openssh-server"):
        netlab.start(2)
    assert_clean()


# ------------------------------------------------------------------------------------------ life cycle
@needs_root
@pytest.mark.timeout(120)
@pytest.mark.lab
@pytest.mark.engines
def test_life_cycle_hosts_names_ssh_and_nothing_left(no_leaks):
    assert_clean()
    ssh_before = ssh_home_state()
    lab = netlab.start(hosts=3, rate="1gbit")
    try:
        assert lab.hosts == ["h1", "h2", "h3"] and lab.addr.startswith("198.18.")
        for host in lab.hosts:
            out = lab.ssh(host, "hostname; ip -o -4 addr show eth0").stdout.split("\n", 1)
            assert out[0] == host and f"inet {lab.addr_of(host)}/24" in out[1]
        # the lab's own names resolve on every host, and a host reaches another with the lab's ssh
        assert lab.ssh("h1", "getent hosts h3").stdout.split()[0] == lab.addr_of("h3")
        assert lab.ssh("h1", f"PATH={lab.dir}/bin:$PATH ssh h2 hostname").stdout.strip() == "h2"
        # what a launcher starts there writes its temp files (a killed rank's autograph files) into the lab's folder
        p = lab.launch("h2", [sys.executable, "-c", "import tempfile; print(tempfile.gettempdir())"],
                       stdout=subprocess.PIPE, text=True)
        assert p.communicate(timeout=60)[0].strip() == os.path.join(lab.dir, "tmp")
        for name in ("userkey", "hostkey", "authorized_keys", "known_hosts", "ssh_config"):
            assert os.stat(os.path.join(lab.dir, name)).st_mode & 0o777 == 0o600, name
        assert all(Path(f"/etc/netns/{lab.ns(h)}/hosts").exists() for h in lab.hosts)
        tc = netlab.run("tc", "qdisc", "show", "dev", lab.veth("h1")).stdout
        tc_ns = netlab.run("tc", "-n", lab.ns("h1"), "qdisc", "show", "dev", "eth0").stdout
        assert "tbf" in tc and "rate 1Gbit" in tc and "tbf" in tc_ns and "rate 1Gbit" in tc_ns
    finally:
        lab.stop()
    assert_clean()
    assert ssh_home_state() == ssh_before, "the user's ~/.ssh changed"


@needs_root
@pytest.mark.timeout(120)
@pytest.mark.lab
@pytest.mark.engines
def test_with_block_exception_and_atexit_leave_nothing(no_leaks):
    with pytest.raises(ZeroDivisionError):
        with netlab.start(hosts=2) as lab:
            assert lab.ssh("h2", "hostname").stdout.strip() == "h2"
            1 / 0
    assert_clean()
    # a kernel that exits without stop(): atexit removes the lab
    code = "import kit.netlab as n; lab = n.start(2); print(lab.ssh('h1', 'hostname').stdout, end='')"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=CHILD_ENV, timeout=90)
    assert p.returncode == 0 and p.stdout == "h1\n", p.stderr
    assert_clean()


@needs_root
@pytest.mark.timeout(150)
@pytest.mark.lab
@pytest.mark.engines
def test_start_after_a_crash_sweeps_the_dead_lab(no_leaks):
    code = textwrap.dedent("""
        import json, time, kit.netlab as n
        lab = n.start(2)
        print(json.dumps({"id": lab.id, "dir": lab.dir, "sshd": [p.pid for p in lab._sshd.values()]}), flush=True)
        time.sleep(600)
    """)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=CHILD_ENV)
    try:
        crashed = json.loads(child.stdout.readline())
    finally:
        child.kill()                                            # SIGKILL: no atexit, no stop()
        child.wait(timeout=30)
    assert crashed["id"] in netlab.lab._kit_resources() and os.path.isdir(crashed["dir"])
    with netlab.start(2) as lab:                                # sweeps the dead lab, then starts
        assert lab.id == crashed["id"], "the crashed lab's number was not freed"
        assert not os.path.exists(crashed["dir"])
        assert not [p for p in crashed["sshd"] if lab_process(str(p))], "the crashed lab's sshd still runs"
        assert lab.ssh("h2", "hostname").stdout.strip() == "h2"
    assert_clean()


@needs_root
@pytest.mark.timeout(120)
@pytest.mark.lab
@pytest.mark.engines
def test_two_labs_at_once(no_leaks):
    with netlab.start(2) as a, netlab.start(2) as b:
        assert a.id != b.id and a.addr != b.addr and a.addr_of("h1") != b.addr_of("h1")
        assert a.ssh("h1", "hostname").stdout == b.ssh("h1", "hostname").stdout == "h1\n"
        # separate switches: a's host cannot reach b's
        probe = "import socket,sys; socket.create_connection((sys.argv[1], 22), timeout=2)"
        p = subprocess.run(a.exec_cmd("h1", sys.executable, "-c", probe, b.addr_of("h1")), capture_output=True)
        assert p.returncode != 0
    assert_clean()


OTHER_PROCESS_LAB = """
import sys, kit.netlab as n
lab = n.start(1)
print(lab.id, flush=True)
sys.stdin.readline()                      # hold the lab until the test says so
print(lab.ssh("h1", "hostname").stdout.strip(), flush=True)
lab.stop()
"""


@needs_root
@pytest.mark.timeout(180)
@pytest.mark.lab
@pytest.mark.engines
def test_labs_of_processes_with_different_temp_dirs_are_not_swept(tmp_path, no_leaks):
    """A lab started from a shell or a kernel (its own TMPDIR) survives a `start()` in `make test` (another TMPDIR):
    the owner record is found by every process, whatever its temp dir."""
    other_tmp = tmp_path / "other-tmp"
    other_tmp.mkdir()
    other = subprocess.Popen([sys.executable, "-c", OTHER_PROCESS_LAB], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, env={**CHILD_ENV, "TMPDIR": str(other_tmp)})
    try:
        other_id = int(other.stdout.readline())
        with netlab.start(1) as mine:          # sweeps stale labs: must not take the other process's
            assert mine.id != other_id and other_id in netlab.lab._kit_resources()
            assert mine.ssh("h1", "hostname").stdout.strip() == "h1"
        other.stdin.write("go\n")
        other.stdin.flush()
        assert other.stdout.readline().strip() == "h1", "the other process's lab was swept"
        assert other.wait(timeout=60) == 0
    finally:
        if other.poll() is None:
            other.kill()
            other.wait()
    assert_clean()


# ---------------------------------------------------------------------------- a stopped lab, another user
STALE = r"this lab \(kitlab{id}, started at \d\d:\d\d:\d\d\) was stopped at \d\d:\d\d:\d\d; start a new one " \
        r"with kit.netlab.start\(\)"
STALE_CALLS = {                          # every public method of a Lab but stop(), called as a user would
    "__enter__": lambda lab: lab.__enter__(), "ns": lambda lab: lab.ns("h1"), "addr_of": lambda lab: lab.addr_of("h1"),
    "veth": lambda lab: lab.veth("h1"), "exec_cmd": lambda lab: lab.exec_cmd("h1", "true"),
    "job_pids": lambda lab: lab.job_pids(), "jobs_left": lambda lab: lab.jobs_left(0),
    "kill_jobs": lambda lab: lab.kill_jobs(), "keep": lambda lab: lab.keep([1]),
    "on_stop": lambda lab: lab.on_stop(print),
    "set_rate": lambda lab: lab.set_rate("1mbit"), "cut": lambda lab: lab.cut("h1"),
    "restore": lambda lab: lab.restore("h2"), "ssh": lambda lab: lab.ssh("h1", "true"),
    "launch": lambda lab: lab.launch("h1", ["true"]), "launch_env": lambda lab: lab.launch_env(),
    "horovodrun_args": lambda lab: lab.horovodrun_args(), "mpi_args": lambda lab: lab.mpi_args(),
    "measure_rate": lambda lab: lab.measure_rate("h1", "h2", 1),
}


def link_state(lab) -> dict[str, str]:
    """Return each host's link as this machine sees it: its state and its shaper's rate (both ends)."""
    out = {}
    for i, h in enumerate(lab.hosts):
        veth, ns = lab.veth(h), lab.ns(h)
        out[h] = (netlab.run("ip", "-o", "link", "show", veth).stdout.split("state ")[1].split()[0],
                  netlab.run("tc", "qdisc", "show", "dev", veth).stdout.split(" rate ")[1].split()[0],
                  netlab.run("tc", "-n", ns, "qdisc", "show", "dev", "eth0").stdout.split(" rate ")[1].split()[0])
    return out


@needs_root
@pytest.mark.timeout(180)
def test_a_stopped_lab_refuses_everything_and_its_successor_is_untouched(no_leaks):
    public = {n for n in dir(netlab.Lab) if callable(getattr(netlab.Lab, n)) and not n.startswith("_")} - {"stop"}
    assert public | {"__enter__"} == set(STALE_CALLS), "a public method of Lab that this test does not call"
    old = netlab.start(hosts=2)
    old.stop()
    old.stop()                                                  # a second stop does nothing
    with netlab.start(hosts=2, rate="100mbit") as new:
        # the successor gets the freed number and names, unless another process's lab (a notebook on the other
        # pytest-xdist worker) took it in between: then the stale lab must still refuse and leave this one alone
        assert new.id != old.id or new.bridge == old.bridge
        job = new.launch("h1", ["sleep", "300"])       # a job of the new lab's: old.kill_jobs() must spare it
        deadline = time.time() + 60      # wait for `sleep` itself: the session's shell is seen a moment earlier
        while time.time() < deadline and not any(
                psutil.Process(p).name() == "sleep" for p in new.job_pids()["h1"] if psutil.pid_exists(p)):
            time.sleep(0.2)
        sshd, jobs, links = [p.pid for p in new._sshd.values()], new.job_pids(), link_state(new)
        for name, call in STALE_CALLS.items():
            with pytest.raises(netlab.LabError, match=STALE.format(id=old.id)):
                call(old)
        assert "stopped at" in repr(old)
        assert link_state(new) == links and links["h1"][0] != "DOWN" and links["h1"][1] == "100Mbit", links
        assert new.job_pids() == jobs and jobs["h1"] and all(psutil.pid_exists(p) for p in sshd)
        assert new.ssh("h2", "hostname").stdout == "h2\n"
        # a Lab whose token is not in the owner record (another process's lab of the same number) refuses too
        impostor = netlab.Lab(new.id, 2, "1gbit", new.dir, token="not-this-labs")
        with pytest.raises(netlab.LabError, match="is no longer registered"):
            impostor.cut("h1")
        assert link_state(new) == links
        new.kill_jobs()
        job.wait(timeout=30)
    assert_clean()


OTHER = 65534
AS_OTHER = ["setpriv", f"--reuid={OTHER}", f"--regid={OTHER}", "--clear-groups"]


@needs_root
@pytest.mark.timeout(180)
def test_another_users_lab_folders_do_not_block_start(monkeypatch, no_leaks):
    """Issue 50: uid 65534 made 64 folders kitlab0-... to kitlab63-... in the temp dir, each with an owner.json
    naming a live process of its own; labs trusted them, and start() said "64 labs are running already"."""
    from conftest import SYSTEM_TMP
    shared = tempfile.mkdtemp(prefix="kit-test-shared-", dir=SYSTEM_TMP)      # every user writes here, as in /tmp
    os.chmod(shared, 0o1777)
    monkeypatch.setattr(tempfile, "tempdir", shared)
    sleeper = subprocess.Popen([*AS_OTHER, "sleep", "600"])                  # setpriv execs it: the same pid
    try:
        deadline = time.time() + 30
        while "sleep" not in open(f"/proc/{sleeper.pid}/cmdline", "rb").read().decode() and time.time() < deadline:
            time.sleep(0.05)
        start = open(f"/proc/{sleeper.pid}/stat").read().rsplit(")", 1)[1].split()[19]
        fakes = [os.path.join(shared, f"kitlab{n}-fake") for n in range(netlab.MAX_LABS)]
        script = "".join(f"mkdir {d} && echo '{json.dumps({'pid': sleeper.pid, 'start': start, 'dir': d})}' "
                         f"> {d}/owner.json && " for d in fakes) + "true"
        subprocess.run([*AS_OTHER, "sh", "-c", script], check=True, timeout=60)
        with netlab.start(hosts=1) as lab:
            assert lab.ssh("h1", "hostname").stdout == "h1\n"
            assert os.path.dirname(lab.dir) == netlab.registry.OWNERS        # in the root-only registry
        assert all(os.lstat(d).st_uid == OTHER and os.path.exists(f"{d}/owner.json") for d in fakes)  # untouched
        assert sleeper.poll() is None                                # the other user's process was not killed
        assert_clean()
    finally:
        sleeper.kill()
        sleeper.wait()
        shutil.rmtree(shared)


# ------------------------------------------------------------------------------------ rate, cut, restore
def capped(measured: dict, rate: str, low=0.60, high=1.10):
    """Every direction at most `high`× the set rate (the shaper's cap: tight) and at least `low`× (the box's floor:
    a busy 2-core box's measuring processes can fall short, e.g. 82 and 87 Mbit/s at 100mbit in one dry run)."""
    want = netlab.parse_rate(rate) / 8
    return all(low <= v / want <= high for v in measured.values())


@needs_root
@pytest.mark.timeout(180)
@pytest.mark.lab
@pytest.mark.engines
def test_measured_rate_matches_the_set_rate_both_ways(no_leaks):
    # Rates the measuring processes reach on a busy 2-core machine: at 400mbit a CI run measured 337 Mbit/s, and at
    # 200mbit a full make test 174 Mbit/s one way (the other test worker had the cores): a limit of the box, not of
    # the shaper this test checks. 100mbit and 25mbit are well below what the box streams when busy. The cap is
    # what the shaper sets, so it is checked tightly; the floor only says the link carries that rate at all.
    with netlab.start(hosts=2, rate="100mbit") as lab:
        first = lab.measure_rate("h1", "h2")
        lab.set_rate("25mbit")
        second = lab.measure_rate("h2", "h1")
    print(f"\n100mbit: {first}\n25mbit: {second}")
    assert capped(first, "100mbit"), first
    assert capped(second, "25mbit"), second       # 25mbit's cap (27.5) is below 100mbit's floor (60): it moved


def can_connect(lab, src, dst, timeout=2) -> bool:
    probe = "import socket,sys; socket.create_connection((sys.argv[1], 22), timeout=float(sys.argv[2]))"
    p = subprocess.run(lab.exec_cmd(src, sys.executable, "-c", probe, lab.addr_of(dst), str(timeout)),
                       capture_output=True, timeout=60)
    return p.returncode == 0


@needs_root
@pytest.mark.timeout(120)
@pytest.mark.lab
@pytest.mark.engines
def test_cut_and_restore_a_link(no_leaks):
    with netlab.start(hosts=3) as lab:
        assert can_connect(lab, "h1", "h2")
        lab.cut("h2")
        assert not can_connect(lab, "h1", "h2") and not can_connect(lab, "h2", "h3")
        assert can_connect(lab, "h1", "h3")                     # the others still talk
        lab.restore("h2")
        assert can_connect(lab, "h1", "h2", timeout=10)
        assert lab.ssh("h2", "hostname").stdout.strip() == "h2"
        with pytest.raises(netlab.LabError, match="no host 'h9'"):
            lab.cut("h9")


# ---------------------------------------------------------------------------------------------- security
def listening(ns: str | None) -> list[tuple[str, str]]:
    """Return (local address, process) of every listening TCP socket in namespace `ns` (None: this one)."""
    cmd = ["ss", "-Hltnp"] if ns is None else ["ip", "netns", "exec", ns, "ss", "-Hltnp"]
    rows = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()
    return [(r.split()[3], r.split()[-1] if "users:" in r else "") for r in rows]


@needs_root
@pytest.mark.timeout(120)
@pytest.mark.lab
@pytest.mark.engines
def test_only_lab_addresses_listen_and_only_the_lab_key_gets_in(tmp_path, no_leaks):
    with netlab.start(hosts=2) as lab:
        sshd = {str(p.pid) for p in lab._sshd.values()}
        for host in lab.hosts:
            socks = listening(lab.ns(host))
            assert socks and all(addr == f"{lab.addr_of(host)}:22" for addr, _ in socks), socks
        root = listening(None)
        assert not [s for s in root if any(f"pid={p}," in s[1] for p in sshd)], root
        # nothing listens on this lab's addresses outside its hosts (another lab, a notebook's beside, may)
        ours = {lab.addr, *(lab.addr_of(h) for h in lab.hosts)}
        assert not [s for s in root if s[0].rsplit(":", 1)[0] in ours], root
        # a key that is not the lab's is refused, and the server offers no password login
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
        p = subprocess.run(["ssh", "-F", "/dev/null", "-i", str(tmp_path / "other"), "-o", "IdentitiesOnly=yes",
                            "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={lab.dir}/known_hosts",
                            "-o", "StrictHostKeyChecking=yes", f"root@{lab.addr_of('h1')}", "hostname"],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 255 and "Permission denied (publickey)" in p.stderr, p.stderr
        assert lab.ssh("h1", "hostname").stdout == "h1\n"       # while the lab's key works
        keys = [os.path.join(lab.dir, k) for k in ("userkey", "hostkey")]
    assert not any(os.path.exists(k) for k in keys)
    assert_clean()


# --------------------------------------------------------------------------------- horovodrun / mpiexec
def rank_pids(lab, host) -> list[int]:
    """Return the pids of the training script's processes running on `host`."""
    out = []
    for pid in netlab.ns_pids(lab.ns(host)):
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().decode().split("\0")
        except OSError:
            continue
        if len(argv) > 1 and argv[1] == SCRIPT:
            out.append(pid)
    return out


# Ranks per host. MPI: one. Its 4-rank start on 2 busy cores stalls now and then (below) and took 74-145 s under the
# suite against 41 s alone; one rank per host keeps what the test proves (a rank killed on the other host ends the
# job; a new job resumes from the checkpoint) at half the CPU. Two per host under mpiexec: test_cluster_lab's MPI
# engines (4 on 2 hosts); under horovodrun: the Gloo variant here.
SLOTS = {"gloo": 2, "mpi": 1}


def launcher(kind, lab, *args):
    if kind == "gloo":
        return [str(BIN / "horovodrun"), "--gloo", *lab.horovodrun_args(SLOTS[kind], ["h1", "h2"]), sys.executable,
                SCRIPT, *TINY, *args]
    return [str(BIN / "mpiexec"), *lab.mpi_args(SLOTS[kind], ["h1", "h2"]), sys.executable, SCRIPT, *TINY, *args]


def what_runs(lab) -> str:
    """Every process on the lab's hosts with its state and kernel wait channel: what a hung job is waiting on."""
    lines = []
    for host in lab.hosts:
        for pid in sorted(netlab.ns_pids(lab.ns(host))):
            try:
                argv = open(f"/proc/{pid}/cmdline", "rb").read().decode().replace("\0", " ")
                status = open(f"/proc/{pid}/status").read()
                state = next(ln.split(":", 1)[1].strip() for ln in status.splitlines() if ln.startswith("State"))
                wchan = open(f"/proc/{pid}/wchan").read()
            except (OSError, StopIteration):
                continue
            lines.append(f"{host} {pid} {state} {wchan or '-'} {argv[:150]}")
    return "\n".join(lines)


# Open MPI's first collective can stall for good when 4 ranks start on 2 busy cores (docs/cluster.md, "A start
# that stalls"): the script then ends the job itself after --init-timeout, and the test starts it again (5 tries).
# What this test proves, a killed rank ends the job and a new job resumes, is checked on a job that did start.
STALL_BOUND = ["--init-timeout", "30"]      # a start that does not stall takes seconds, busy or not


def launch_past_stalls(lab, argv, ckpt=None, attempts=5):
    """Launch `argv` from h1; a start that stalled (it says so and ends within STALL_BOUND) is started again, at
    most `attempts` times. With `ckpt`: return the running Popen once it wrote its first checkpoint; without: wait
    for the job to end and return its (exit status, output). Also return how many stalled starts came before."""
    for stalls in range(attempts):
        p = lab.launch("h1", argv, cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if ckpt is not None:
            deadline = time.time() + 400
            while not mnist.list_checkpoints(ckpt) and p.poll() is None and time.time() < deadline:
                time.sleep(0.2)
            if mnist.list_checkpoints(ckpt):
                return p, stalls
        rc, out = finish(p, 300 if ckpt is not None else 700, lab)
        if STALLED not in out:
            assert ckpt is None, f"the job ended (rc {rc}) or hung with no checkpoint, not from a stalled start:\n" \
                                 f"{out[-3000:]}"
            return (rc, out), stalls
        print(f"start {stalls + 1}: " + next(ln for ln in out.splitlines() if STALLED in ln))
    raise AssertionError(f"{attempts} starts in a row stalled")


# Open MPI 5.0.11 (PRRTE 3.0.11), the newest on PyPI: after a rank is SIGKILLed and the others abort on "peer hung
# up", every rank ends within seconds, but now and then the launcher itself never exits: prterun on h1 and the
# daemon prted on h2 both wait in their event loops (do_epoll_wait), prted's ssh-attached parent on its pipe, with
# no rank left: PRRTE's termination of the job is lost (the family of openpmix/prrte#1607). Seen in two full suites
# here (of the last sessions' dozen or so), never in 10 runs of this step alone (one core kept busy, PRRTE's
# errmgr/state/odls/plm logs on). What the kill step proves, that the job notices its killed rank, is every rank
# ending within the bound; a launcher still there LINGER s after its last rank is ended here and said so
# (docs/netlab.md).
LINGER = 30


def finish(proc, timeout, lab=None, linger=None):
    """Wait for `proc`; past `timeout`, fail with what was still running on the lab (then kill it). With `linger`
    (the job's ranks running now): once no rank is left on the lab, the launcher has `linger` s to exit, else it
    is ended with its daemons, and the exit status returned is None."""
    deadline, gone_since = time.time() + timeout, None
    try:
        while True:
            try:
                out, _ = proc.communicate(timeout=1)
                return proc.returncode, out
            except subprocess.TimeoutExpired:
                pass
            if linger is not None:
                gone_since = None if any(rank_pids(lab, h) for h in lab.hosts) else gone_since or time.time()
                if gone_since is not None and time.time() - gone_since > linger:
                    running = what_runs(lab)
                    proc.kill()
                    out, _ = proc.communicate()
                    lab.kill_jobs()             # prterun on h1, prted on h2: what the job left
                    print(f"\nevery rank ended, but Open MPI's launcher was still there {linger} s later (ended "
                          f"with lab.kill_jobs(); see LINGER):\n{running}")
                    return None, out
            if time.time() > deadline:
                running = what_runs(lab) if lab else ""
                proc.kill()
                out, _ = proc.communicate()
                raise AssertionError(f"the job had not ended {timeout} s later; still running:\n{running}\n"
                                     f"its output:\n{(out or '')[-3000:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@needs_root
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("kind", ["gloo", "mpi"])
@pytest.mark.lab
@pytest.mark.engines
def test_launcher_across_two_hosts_killed_and_resumed(kind, tmp_path, no_leaks):
    ckpt, total, t0, ssh_before = tmp_path / "ckpt", 40, time.time(), ssh_home_state()
    sessions = set(glob.glob("/tmp/prted.*"))       # Open MPI's daemons' session folders: the lab's, not /tmp
    with netlab.start(hosts=2) as lab:
        # 1. SLOTS ranks per host, started from h1 as on a real cluster; kill one rank on h2 mid-run.
        p, stalls = launch_past_stalls(lab, launcher(kind, lab, "--epochs", str(total), "--checkpoint-dir",
                                                     str(ckpt), *STALL_BOUND), ckpt)
        on_h2 = rank_pids(lab, "h2")
        assert len(on_h2) == len(rank_pids(lab, "h1")) == SLOTS[kind], f"not {SLOTS[kind]} rank(s) on each host"
        for host in lab.hosts:      # a namespace has only lo and eth0: all it listens on is the lab or loopback
            socks = [a.rsplit(":", 1)[0] for a, _ in listening(lab.ns(host))]
            assert set(socks) <= {lab.addr_of(host), "0.0.0.0", "*", "[::]", "127.0.0.1", "[::1]"}, socks
            links = netlab.run("ip", "-n", lab.ns(host), "-o", "link").stdout.splitlines()
            assert [ln.split(":")[1].strip().split("@")[0] for ln in links] == ["lo", "eth0"], links
        os.kill(on_h2[0], signal.SIGKILL)
        t_kill = time.time()
        rc, out = finish(p, 300, lab, linger=LINGER if kind == "mpi" else None)
        print(f"\n{kind}: first checkpoint after {t_kill - t0:.0f} s ({stalls} stalled start(s) ended and "
              f"restarted), job ended {time.time() - t_kill:.0f} s after the kill")
        assert rc != 0, f"the job did not notice its killed rank:\n{out[-3000:]}"     # None: ranks ended, see LINGER
        done = [int(mnist.CKPT_RE.search(c.name)[1]) for c in mnist.list_checkpoints(ckpt)]
        assert done and max(done) < total, f"not killed mid-way: checkpoints {done}"
        # 2. Again with the same checkpoint dir: resumes after the last checkpoint and finishes.
        last = max(done)
        t1 = time.time()
        (rc, out), stalls = launch_past_stalls(lab, launcher(kind, lab, "--epochs", str(last + 2), "--checkpoint-dir",
                                                             str(ckpt), "--json", str(tmp_path / "r.json"),
                                                             *STALL_BOUND))
        print(f"{kind}: resumed run {time.time() - t1:.0f} s ({stalls} stalled start(s) before it)")
        assert rc == 0, out[-3000:]
        assert f"resumed from epoch {last}" in out and "replicas identical: True" in out, out[-3000:]
        result = json.loads((tmp_path / "r.json").read_text())
        assert result["size"] == 2 * SLOTS[kind] and [h["epoch"] for h in result["history"]] == [last + 1, last + 2]
        assert not rank_pids(lab, "h1") and not rank_pids(lab, "h2")
    assert_clean()
    assert ssh_home_state() == ssh_before, "the user's ~/.ssh changed"
    # A folder whose daemon still runs is another job's (a notebook's lab, beside this test under two workers).
    left = [d for d in set(glob.glob("/tmp/prted.*")) - sessions if not psutil.pid_exists(int(d.rsplit(".", 1)[1]))]
    assert not left, f"a lab host's Open MPI daemon left its folder in /tmp: {left}"
