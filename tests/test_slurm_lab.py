"""kit.netlab.slurm: a real Slurm cluster on 3 lab hosts. Nodes idle, srun on every host, a batch job queued, run
and gone with its output on the shared file system, impossible requests refused with Slurm's reason, mpiexec under
salloc across the hosts, the batch MNIST job (scripts/slurm_mnist.sbatch) cancelled and resumed, a killed slurmd
marking its node down, nothing left after stop or after a SIGKILLed owner.

These need root (network namespaces) and Debian's slurmctld, slurmd, slurm-client and munge (`make setup` as root
installs them). CI runs as root, so there they always run; without root they are skipped with the reason.
"""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from ipyparallel import interactive
from conftest import lab_leftovers

import kit.cluster as kc
from kit import mnist, netlab
from kit.netlab import slurm

REPO = Path(__file__).resolve().parent.parent
needs_root = pytest.mark.requires_root
MNIST_TINY = ["--dataset", "digits", "--train-samples", "512", "--batch-size", "32", "--threads", "1"]
CHILD_ENV = dict(os.environ, PYTHONPATH=str(REPO))
DAEMONS = ("munged", "slurmctld", "slurmd", "slurmstepd")


def slurm_processes() -> list[str]:
    """Return every live (not zombie) Slurm or MUNGE process on this machine that was not there before this module
    (a machine's own munged, say), as 'pid: command line'."""
    out = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit() and p not in BEFORE):
        try:
            state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
            argv = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace").split("\0")
        except OSError:
            continue
        name = os.path.basename(argv[0].split(":")[0])           # also 'slurmstepd: [1.0]', 'slurmctld: slurmscriptd'
        if state != "Z" and name in DAEMONS:
            out.append(f"{pid}: {' '.join(argv)}")
    return out


BEFORE: set[str] = set()
BEFORE.update(p.split(":")[0] for p in slurm_processes())


NOTHING = {"resources": [], "processes": [], "slurm": []}


def assert_clean():
    """Nothing of any lab (namespaces, links, dirs, owner records) and no Slurm process left (10 s grace)."""
    deadline = time.time() + 10
    while (left := {**lab_leftovers(), "slurm": slurm_processes()}) != NOTHING and time.time() < deadline:
        time.sleep(0.2)
    assert left == NOTHING, f"left behind: {left}"


@pytest.fixture(scope="module")
def cluster():
    """One 3-host lab with Slurm for the whole module; the last test stops it and checks what is left."""
    with netlab.start(hosts=3) as lab:
        t0 = time.time()
        with slurm.start(lab) as sl:
            print(f"\nSlurm: every node idle {time.time() - t0:.1f} s after start")
            yield lab, sl


def no_jobs_within(sl, seconds: float) -> bool:
    """Wait until squeue shows no job; return whether that happened within `seconds`."""
    deadline = time.time() + seconds
    while sl.jobs() and time.time() < deadline:
        time.sleep(0.2)
    return not sl.jobs()


def lines(p: subprocess.CompletedProcess) -> list[str]:
    assert p.returncode == 0, f"exit {p.returncode}: {p.stderr}"
    return sorted(p.stdout.splitlines())


# --------------------------------------------------------------------------------------------- the cluster
@needs_root
@pytest.mark.timeout(120)
@pytest.mark.lab
@pytest.mark.engines
def test_every_host_is_an_idle_node_and_nothing_is_outside_the_lab(cluster):
    lab, sl = cluster
    assert sl.nodes() == {"h1": "idle", "h2": "idle", "h3": "idle"}
    conf = Path(sl.conf).read_text()
    assert f"SlurmctldHost=h1({lab.addr_of('h1')})" in conf and "PartitionName=lab Nodes=ALL Default=YES" in conf
    assert sl.env["SLURM_CONF"] == sl.conf and sl.conf.startswith(lab.dir)
    assert os.stat(os.path.join(sl.dir, "munge.key")).st_mode & 0o777 == 0o400
    in_lab = set().union(*(netlab.ns_pids(lab.ns(h)) for h in lab.hosts))
    pids = [int(line.split(":")[0]) for line in slurm_processes() if sl.dir in line]
    assert len(pids) >= 5 and set(pids) <= in_lab, "a Slurm daemon runs outside the lab's hosts"
    root = subprocess.run(["ss", "-Hltnpu"], capture_output=True, text=True, check=True).stdout
    assert not [r for r in root.splitlines() if any(f"pid={p}," in r for p in pids)], root


@needs_root
@pytest.mark.timeout(120)
@pytest.mark.lab
@pytest.mark.engines
def test_srun_runs_one_task_on_each_host(cluster):
    lab, sl = cluster
    lab.kill_jobs()                           # what kit.mnist.lab does after a job: spares Slurm, as it spares sshd
    t0 = time.time()
    p = sl.run(["srun", "-N3", "-n3", "sh", "-c", "echo $(hostname) $SLURM_PROCID"])
    print(f"\nsrun -N3 -n3 round trip: {time.time() - t0:.2f} s")
    assert lines(p) == ["h1 0", "h2 1", "h3 2"]
    assert lines(sl.run(["srun", "-N3", "-n3", "hostname"])) == ["h1", "h2", "h3"]


@needs_root
@pytest.mark.timeout(120)
@pytest.mark.lab
@pytest.mark.engines
def test_a_batch_job_is_queued_runs_and_leaves_its_output(cluster, tmp_path):
    _, sl = cluster
    out = tmp_path / "job-%j.out"
    p = sl.run(["sbatch", "--parsable", "-o", str(out), "--wrap", "sleep 2; echo done on $(hostname)"])
    job = p.stdout.strip()
    assert p.returncode == 0 and job.isdigit(), p.stderr
    assert job in sl.jobs()
    assert no_jobs_within(sl, 60), f"the job did not end within 60 s: {sl.jobs()}"
    text = (tmp_path / f"job-{job}.out").read_text()
    assert text.strip() in {"done on h1", "done on h2", "done on h3"}, text


@needs_root
@pytest.mark.timeout(120)
@pytest.mark.lab
@pytest.mark.engines
def test_impossible_requests_are_refused_with_slurms_reason(cluster):
    _, sl = cluster
    too_many = sl.run(["sbatch", "-N4", "--wrap", "true"])
    assert too_many.returncode == 1 and "Node count specification invalid" in too_many.stderr, too_many.stderr
    no_partition = sl.run(["sbatch", "-p", "nosuch", "--wrap", "true"])
    assert no_partition.returncode == 1 and "Invalid partition name specified" in no_partition.stderr
    srun = sl.run(["srun", "-N4", "true"], timeout=30)
    assert srun.returncode == 1 and "Node count specification invalid" in srun.stderr, srun.stderr
    assert sl.jobs() == []


MPI_CHECK = ("from mpi4py import MPI; import socket; c = MPI.COMM_WORLD; "
             "print(c.rank, c.size, socket.gethostname(), c.allreduce(c.rank + 1))")


@needs_root
@pytest.mark.timeout(180)
@pytest.mark.lab
@pytest.mark.engines
def test_mpiexec_under_salloc_spans_the_three_hosts(cluster):
    _, sl = cluster
    t0 = time.time()
    p = sl.run(["salloc", "-N3", "-n3", str(Path(sys.executable).parent / "mpiexec"), "-n", "3",
                "--mca", "btl_tcp_if_include", "eth0", "--mca", "oob_tcp_if_include", "eth0",
                sys.executable, "-c", MPI_CHECK], timeout=150)
    print(f"\nsalloc + mpiexec, 3 ranks on 3 hosts: {time.time() - t0:.1f} s")
    assert lines(p) == ["0 3 h1 6", "1 3 h2 6", "2 3 h3 6"], p.stderr
    assert no_jobs_within(sl, 30), sl.jobs()                 # the allocation ends (COMPLETING, then gone)


@needs_root
@pytest.mark.timeout(600)
@pytest.mark.lab
@pytest.mark.engines
def test_the_sbatch_mnist_job_trains_on_three_hosts_and_resumes_after_scancel(cluster, tmp_path):
    """scripts/slurm_mnist.sbatch: notebook 04's job as a batch job, Horovod over MPI on h1..h3; cancelled after two
    checkpoints, submitted again with the same CKPT, it resumes after the last one and finishes; squeue ends empty."""
    lab, sl = cluster
    lab.kill_jobs()
    ckpt, log = tmp_path / "ckpt", tmp_path / "job.out"
    env = {"CKPT": str(ckpt), "KIT": str(REPO), "PYTHON": sys.executable, "MPI_IFACE": "eth0"}

    def submit(epochs: int) -> str:
        p = sl.run(["sbatch", "--parsable", "-N3", "-o", str(log), str(REPO / "scripts" / "slurm_mnist.sbatch"),
                    *MNIST_TINY, "--epochs", str(epochs)], env=env)
        assert p.returncode == 0, p.stderr
        return p.stdout.strip().split(";")[0]

    first = submit(40)
    deadline = time.time() + 240
    while len(mnist.list_checkpoints(ckpt)) < 2 and first in sl.jobs() and time.time() < deadline:
        time.sleep(0.5)
    show = sl.run(["scontrol", "show", "job", first]).stdout
    assert "JobState=RUNNING" in show and "NumNodes=3" in show, show + log.read_text()[-2000:]
    sl.run(["scancel", first], check=True)
    assert no_jobs_within(sl, 60), sl.jobs()
    done = [int(mnist.CKPT_RE.search(c.name)[1]) for c in mnist.list_checkpoints(ckpt)]
    assert len(done) >= 2 and max(done) < 40, f"not cancelled mid-way: checkpoints {done}"
    last = max(done)
    second = submit(last + 2)
    deadline = time.time() + 240
    while second in sl.jobs() and time.time() < deadline:
        time.sleep(0.5)
    out = log.read_text()
    assert sl.jobs() == [], out[-3000:]
    assert "JobState=COMPLETED" in sl.run(["scontrol", "show", "job", second]).stdout, out[-3000:]
    assert f"kit-mnist: job {second} (restart 0) on h[1-3], 3 ranks" in out, out[-3000:]
    assert f"resumed from epoch {last}" in out and "on 3 worker(s)" in out.split("done:")[-1], out[-3000:]
    assert "replicas identical: True" in out, out[-3000:]


# ---------------------------------------------------------------------- kit.cluster's engines as a Slurm job
def engine_pids_alive(c, grace: float = 10) -> list[int]:
    """Return the engines' pids still running (not zombies: killed ranks wait a moment for init) after `grace` s."""
    import psutil

    def alive(pid):
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False
    deadline = time.time() + grace
    while (left := [p for p in c._pids.values() if alive(p)]) and time.time() < deadline:
        time.sleep(0.2)
    return left


@needs_root
@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", ["gloo", "mpi"])
@pytest.mark.lab
@pytest.mark.engines
def test_kit_cluster_engines_are_one_slurm_job_with_slurms_ranks(cluster, backend):
    """kit.cluster.start(slurm=sl): one batch job over the three nodes; ranks, local ranks and hostnames as Slurm
    (gloo: srun's SLURM_PROCID) or MPI inside the allocation assign them; Horovod sums over all three; the job is
    visible while it runs, and stop() leaves squeue empty and no engine alive."""
    _, sl = cluster
    t0 = time.time()
    c = kc.start(n=3, backend=backend, slurm=sl, timeout=30, quiet=True)
    try:
        print(f"\n{backend}: 3 engines as Slurm job {c.launcher.job_id} in {time.time() - t0:.1f} s")
        job = c.launcher.job_info()
        assert [job[k] for k in ("JobState", "NodeList", "NumTasks", "Partition")] == ["RUNNING", "h[1-3]", "3", "lab"]
        assert job["JobName"].startswith("kit-engines-") and sl.jobs() == [c.launcher.job_id]
        assert {s.rank: (s.hostname, s.local_rank) for s in c.slots.values()} == {0: ("h1", 0), 1: ("h2", 0),
                                                                                  2: ("h3", 0)}
        seen = c.view.apply_sync(where)
        assert [(h, r) for h, _, _, r in seen] == [("h1", 0), ("h2", 1), ("h3", 2)]
        assert {j for _, j, _, _ in seen} == {c.launcher.job_id}
        if backend == "gloo":
            assert [int(p) for _, _, p, _ in seen] == [0, 1, 2]           # the rank is Slurm's task rank
    finally:
        c.stop()
    assert sl.jobs() == [] and not engine_pids_alive(c)


@needs_root
@pytest.mark.timeout(240)
@pytest.mark.lab
@pytest.mark.engines
def test_a_slurm_job_refused_or_left_pending_is_a_clear_error_and_nothing_stays_queued(cluster):
    _, sl = cluster
    with pytest.raises(kc.ClusterError, match=r"Slurm refused the engines' job: .*Invalid partition name"):
        kc.start(n=3, slurm=dict(cluster=sl, partition="nosuch"), quiet=True)
    with pytest.raises(kc.ClusterError, match=r"Slurm refused the engines' job: .*Node count specification invalid"):
        kc.start(n=4, slurm=dict(cluster=sl, nodes=4), quiet=True)
    with pytest.raises(ValueError, match="do not split evenly"):
        kc.start(n=4, slurm=sl, quiet=True)
    assert sl.jobs() == []
    blocker = sl.run(["sbatch", "--parsable", "-N3", "--exclusive", "-o", "/dev/null", "--wrap", "sleep 300"],
                     check=True).stdout.strip()                  # -o: no slurm-N.out in the working directory
    try:
        t0 = time.time()
        with pytest.raises(kc.ClusterError, match=r"Slurm job \d+ is PENDING \(reason: (Resources|Priority)\).*"
                                                  r"cancelled, nothing is left queued"):
            kc.start(n=3, slurm=dict(cluster=sl, queue_timeout=5), quiet=True)
        print(f"\npending job named and cancelled after {time.time() - t0:.1f} s")
        assert sl.jobs() == [blocker]
    finally:
        sl.run(["scancel", blocker])
    assert no_jobs_within(sl, 30), sl.jobs()


@interactive          # sent by value: the engines cannot import this test module
def where():
    import os
    import socket
    e = os.environ
    return socket.gethostname(), e.get("SLURM_JOB_ID"), e.get("SLURM_PROCID"), int(e["KIT_RANK"])


@interactive
def allreduce_after(seconds: float, sleeper: int = 2) -> float:
    """On an engine: rank `sleeper` sleeps `seconds` first; every rank then sums a one over the job."""
    import time as t

    import horovod.torch as hvd
    import torch
    if hvd.rank() == sleeper:
        t.sleep(seconds)
    return hvd.allreduce(torch.ones(1), op=hvd.Sum).item()


@needs_root
@pytest.mark.timeout(300)
@pytest.mark.lab
@pytest.mark.engines
def test_a_node_cut_off_during_a_collective_is_a_dead_rank_named_by_slurm(cluster):
    """h3's cable pulled while rank 2's engine there is busy and ranks 0, 1 wait in an allreduce: slurmctld stops
    hearing h3's slurmd, and kit.cluster names rank 2 on h3 from Slurm's node state, before Gloo's own timeout.
    Slurm then marks h3 down and ends the job (NODE_FAIL; the engines' jobs are not requeued), and a new job of 2
    engines runs on the remaining nodes."""
    lab, sl = cluster
    c = kc.start(n=3, backend="gloo", slurm=sl, timeout=60, quiet=True)
    try:
        assert c.wait(c.view.apply_async(allreduce_after, 0)) == [3.0, 3.0, 3.0]
        pending = c.view.apply_async(allreduce_after, 600)
        time.sleep(1)
        lab.cut("h3")
        t0 = time.time()
        with pytest.raises(kc.RankDiedError, match=r"rank 2 died \(node h3 is \S+ in Slurm"):
            c.wait(pending)
        named = time.time() - t0
        assert named < 60
        while (state := c.launcher.job_info().get("JobState")) in ("RUNNING", "COMPLETING") and time.time() - t0 < 90:
            time.sleep(0.5)                           # what Slurm itself does: h3 DOWN, the job ended
        print(f"\nrank 2 on the cut h3 named {named:.0f} s after the cut (Gloo's timeout: 60 s); Slurm: job "
              f"{state} and h3 {sl.nodes().get('h3')} {time.time() - t0:.0f} s after it")
        assert state == "NODE_FAIL" and sl.nodes()["h3"].startswith("down")
        c.stop()
        with kc.start(n=2, backend="gloo", slurm=dict(cluster=sl, nodes=2), timeout=60, quiet=True) as c2:
            assert sorted(s.hostname for s in c2.slots.values()) == ["h1", "h2"]      # Slurm avoids h3
            assert c2.wait(c2.view.apply_async(allreduce_after, 0)) == [2.0, 2.0]
    finally:
        lab.restore("h3")
        c.stop()
    # The cable is back: what an admin types then. (ReturnToService=2 alone returns h3 too, but slurmctld asks a
    # down node to register only every 20th ping round, SlurmdTimeout/3 apart: up to a minute here; ping_nodes.c.)
    sl.run(["scontrol", "update", "NodeName=h3", "State=RESUME"], check=True)
    deadline = time.time() + 90                       # idle once slurmctld's next ping reaches h3's slurmd
    while sl.nodes() != {"h1": "idle", "h2": "idle", "h3": "idle"} and time.time() < deadline:
        time.sleep(0.5)
    assert sl.nodes() == {"h1": "idle", "h2": "idle", "h3": "idle"} and sl.jobs() == []


@needs_root
@pytest.mark.timeout(120)
@pytest.mark.lab
@pytest.mark.engines
def test_a_killed_slurmd_marks_its_node_down(cluster):
    lab, sl = cluster
    slurmd = [p for p in netlab.ns_pids(lab.ns("h3"))
              if open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")[0] == slurm.find("slurmd").encode()]
    assert len(slurmd) == 1, slurmd
    os.kill(slurmd[0], signal.SIGKILL)
    t0, deadline = time.time(), time.time() + 90
    while not sl.nodes().get("h3", "").startswith("down") and time.time() < deadline:
        time.sleep(0.5)
    print(f"\nh3 down {time.time() - t0:.0f} s after its slurmd was killed (SlurmdTimeout=10)")
    assert sl.nodes() == {"h1": "idle", "h2": "idle", "h3": "down*"}


@needs_root
@pytest.mark.timeout(120)
@pytest.mark.lab
@pytest.mark.engines
def test_stop_leaves_nothing(cluster):
    lab, sl = cluster
    sl.stop()
    assert not os.path.exists(sl.dir) and not [p for p in slurm_processes() if lab.dir in p]
    assert all(p.poll() is not None for p in sl.daemons.values())        # reaped, not zombies
    lab.stop()
    assert_clean()


# ------------------------------------------------------------------------------------- failures to start
@needs_root
@pytest.mark.timeout(120)
@pytest.mark.lab
@pytest.mark.engines
def test_a_start_that_does_not_reach_idle_says_why_and_leaves_nothing(monkeypatch, no_leaks):
    monkeypatch.setattr(slurm, "node_line", lambda slurmd: "CPUs=64")     # more CPUs than slurmd finds
    with netlab.start(1) as lab:
        with pytest.raises(netlab.LabError, match=r"(?s)not every node became idle within 5 s.*Low CPUs"):
            slurm.start(lab, timeout=5)
        assert not os.path.exists(os.path.join(lab.dir, "slurm")) and not [
            p for p in slurm_processes() if lab.dir in p]
        with pytest.raises(netlab.LabError, match="letters, digits"):
            slurm.start(lab, partition="no such")
    assert_clean()


# ------------------------------------------------------------------------------------- a SIGKILLed owner
@needs_root
@pytest.mark.timeout(150)
@pytest.mark.lab
@pytest.mark.engines
def test_a_sigkilled_owners_slurm_is_swept_by_the_next_start(no_leaks):
    code = textwrap.dedent("""
        import json, time, kit.netlab as n
        lab = n.start(2)
        sl = n.slurm.start(lab)
        print(json.dumps({"dir": sl.dir, "pids": [p.pid for p in sl.daemons.values()]}), flush=True)
        time.sleep(600)
    """)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=CHILD_ENV)
    try:
        crashed = json.loads(child.stdout.readline())
    finally:
        child.kill()                                           # SIGKILL: no atexit, no stop()
        child.wait(timeout=30)
    assert os.path.isdir(crashed["dir"]) and [p for p in slurm_processes() if crashed["dir"] in p]
    with netlab.start(1):                                      # sweeps the dead lab and its Slurm
        assert not os.path.exists(crashed["dir"])
        assert not [p for p in slurm_processes() if crashed["dir"] in p]
    assert_clean()


def test_without_slurm_the_error_names_the_packages(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(os.path, "exists", lambda p: False)
    with pytest.raises(netlab.LabError, match="apt-get install -y slurmctld slurmd slurm-client munge"):
        slurm.find("slurmd")
