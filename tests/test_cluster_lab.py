"""kit.cluster on the emulated-host lab (kit.netlab): engines on two hosts over SSH (gloo) and mpiexec -H (mpi),
Horovod ranks as horovodrun gives them, sums for torch, TF and torch.distributed, a cut link, a dead sshd,
listening sockets, and nothing left behind.

One lab and one cluster per backend are shared by the tests (module-scoped fixtures): starting 4 engines that
import torch and TF is most of the cost. Needs root (network namespaces): skipped without it; CI runs as root.
"""
import os
import sys
import time

import psutil
import pytest
from ipyparallel import interactive

import kit.cluster as kc
from kit import netlab

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = [pytest.mark.lab, pytest.mark.engines, pytest.mark.requires_root]
TIMEOUT = 20                      # the cluster's timeout: how long a collective waits for a lost peer
N = 1_000_003                     # an awkward size: not a multiple of anything the transports chunk by
EXPECTED = [("h1", 0, 0, 0), ("h1", 1, 1, 0), ("h2", 2, 0, 1), ("h2", 3, 1, 1)]   # horovodrun -H h1:2,h2:2


def lab_processes(lab) -> dict[int, str]:
    """Return {pid: command line} of what runs on the lab's hosts, except their SSH servers."""
    sshd = {p.pid for p in lab._sshd.values()}
    out = {}
    for host in lab.hosts:
        for pid in netlab.ns_pids(lab.ns(host)) - sshd:
            try:
                p = psutil.Process(pid)
                if p.status() != psutil.STATUS_ZOMBIE:
                    out[pid] = " ".join(p.cmdline())[:150]
            except psutil.Error:
                pass
    return out


def live(procs) -> set:
    """The processes of `procs` still running (not gone, not zombies)."""
    out = set()
    for p in procs:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                out.add(p)
        except psutil.Error:
            pass
    return out


def wait_until_empty(get, seconds=15):
    deadline = time.time() + seconds
    while (left := get()) and time.time() < deadline:
        time.sleep(0.2)
    return left


@pytest.fixture(scope="module")
def lab():
    lab = netlab.start(hosts=2)
    yield lab
    lab.stop()
    assert not netlab.lab._kit_resources().get(lab.id), "the lab left namespaces, links or files behind"


@pytest.fixture(scope="module", params=["gloo", "mpi"])
def cluster(request, lab):
    mine = set(psutil.Process().children(recursive=True))
    c = kc.start(n=4, backend=request.param, hosts=lab, timeout=TIMEOUT, quiet=True)
    yield c
    c.stop()
    assert not wait_until_empty(lambda: lab_processes(lab)), f"left on the lab's hosts: {lab_processes(lab)}"
    left = wait_until_empty(lambda: set(psutil.Process().children(recursive=True)) - mine)
    assert not left, f"processes left here: {left}"


# ----------------------------------------------------------------------------------- run on the engines
@interactive          # sent by value: the engines cannot import this test module
def whoami():
    import os
    import socket
    import sys
    import horovod.torch as hvd
    import kit
    return {"slot": (socket.gethostname(), hvd.rank(), hvd.local_rank(), hvd.cross_rank()), "size": hvd.size(),
            "python": sys.executable, "kit": os.path.dirname(os.path.dirname(kit.__file__)),
            "iface": (os.environ.get("HOROVOD_GLOO_IFACE"), os.environ.get("GLOO_SOCKET_IFNAME"))}


@interactive
def allreduce_torch_and_tf():
    import horovod.tensorflow as hvd_tf
    import horovod.torch as hvd
    import tensorflow as tf
    import torch
    hvd_tf.init()
    r = hvd.rank()
    t = hvd.allreduce(torch.arange(5, dtype=torch.float64) * (r + 1), op=hvd.Sum, name="lab.torch")
    f = hvd_tf.allreduce(tf.range(5, dtype=tf.float64) * (r + 1), op=hvd_tf.Sum, name="lab.tf")
    return t.tolist(), f.numpy().tolist()


@interactive
def dist_allreduce(n):
    import torch
    import torch.distributed as dist
    t = torch.arange(n, dtype=torch.float64) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    want = torch.arange(n, dtype=torch.float64) * sum(range(1, dist.get_world_size() + 1))
    return t.numel(), bool(torch.equal(t, want))


@interactive
def allreduce_many(count):
    """Allreduce a small tensor `count` times (the same number on every rank; the test cuts a link meanwhile)."""
    import horovod.torch as hvd
    import torch
    for i in range(count):
        hvd.allreduce(torch.ones(1000), name=f"lab.loop.{i}")
    return count


# ------------------------------------------------------------------------------------------------ tests
@pytest.mark.timeout(400)
def test_engines_sit_on_the_lab_hosts_with_horovodrun_ranks(cluster):
    out = cluster.view.apply_sync(whoami)
    assert [o["slot"] for o in out] == EXPECTED
    assert {o["size"] for o in out} == {4}
    assert {o["python"] for o in out} == {sys.executable}         # the user's venv, over the shared file system
    assert {o["kit"] for o in out} == {REPO}                       # and this kit
    if cluster.backend == "gloo":     # the interface that carries the lab address on each host
        assert {o["iface"] for o in out} == {("eth0", "eth0")}
    assert [cluster.slots[e].hostname for e in cluster.view.targets] == ["h1", "h1", "h2", "h2"]


@pytest.mark.timeout(400)
def test_horovod_allreduce_sums_torch_and_tf(cluster):
    want = [i * (1 + 2 + 3 + 4) for i in range(5)]
    for torch_sum, tf_sum in cluster.wait(cluster.view.apply_async(allreduce_torch_and_tf)):
        assert torch_sum == want and tf_sum == want


@pytest.mark.timeout(400)
def test_torch_distributed_across_hosts_awkward_size(cluster):
    assert cluster.init_process_group() == {e: cluster.rank_of(e) for e in cluster.view.targets}
    assert cluster.wait(cluster.view.apply_async(dist_allreduce, N)) == [(N, True)] * 4


def listening(ns=None) -> list[tuple[str, int]]:
    """Return (address, pid) of each listening TCP socket in namespace `ns` (None: this machine's own)."""
    import subprocess
    cmd = ["ss", "-Hltnp"] if ns is None else ["ip", "netns", "exec", ns, "ss", "-Hltnp"]
    rows = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()
    out = []
    for r in rows:
        addr = r.split()[3].rsplit(":", 1)[0]
        for pid in (int(p.split("=")[1].rstrip(",)")) for p in r.split() if "pid=" in p for p in p.split(",")
                    if p.startswith("pid=")):
            out.append((addr, pid))
    return out


@pytest.mark.timeout(400)
def test_servers_listen_only_on_lab_addresses_and_loopback(cluster, lab):
    cluster.init_process_group()            # torch.distributed's store too
    ours = {p.pid: p.name() for p in psutil.Process().children(recursive=True)} | {os.getpid(): "pytest"}
    here = [(a, ours[p]) for a, p in listening() if p in ours]
    assert here, "found no listening socket of the controller"
    # Nothing on this machine listens beyond the lab's address and loopback: for mpi, mpiexec (Open MPI 5's
    # prterun, whose daemon-control listener takes every address whatever oob_tcp_if_include says) runs on h1.
    wild = [(a, name) for a, name in here if a not in (lab.addr, "127.0.0.1")]
    assert not wild, here
    if cluster.backend == "mpi":
        on_h1 = {psutil.Process(p).name() for _, p in listening(lab.ns("h1"))}
        assert "prterun" in on_h1 or "mpiexec" in on_h1, on_h1
    for host in lab.hosts:   # a host has only lo and eth0 (the lab's address): a wildcard there is the lab only
        socks = listening(lab.ns(host))
        assert {a for a, _ in socks} <= {lab.addr_of(host), "127.0.0.1", "0.0.0.0", "*", "[::]"}, socks


@pytest.mark.timeout(400)
@pytest.mark.parametrize("cluster", ["gloo"], indirect=True)
def test_cut_link_names_the_lost_host_then_restart_works(cluster, lab):
    ar = cluster.view.apply_async(allreduce_many, 10**8)
    time.sleep(3)
    assert not ar.ready(), f"the allreduce loop ended before the cut: {ar.ready() and ar.get()}"
    lab.cut("h2")
    t_cut = time.time()
    try:
        with pytest.raises(kc.RankDiedError) as err:
            cluster.wait(ar)
        seconds = time.time() - t_cut
        print(f"\ncut h2: error after {seconds:.1f} s (cluster timeout {TIMEOUT} s): {err.value}")
        assert "h2" in str(err.value) and "unreachable" in str(err.value)
        assert "rank 2" in str(err.value) and "3" in str(err.value)
        assert seconds < TIMEOUT + 5                       # the hosts' SSH ports are probed while waiting
        # each engine's own error: the survivors' (ranks 0, 1 on h1) calls raised Horovod's error (Gloo's timeout)
        cause = err.value.__cause__
        if cause is None:                                  # raised before every reply was in
            ar.wait(3 * TIMEOUT)
            try:
                ar.get(timeout=0)
            except Exception as e:
                cause = e
        errors = {(info or {}).get("engine_id"): (ename, str(evalue))
                  for ename, evalue, _, info in getattr(cause, "elist", [])}

        def horovods(e):   # a survivor between two calls when Horovod shut down gets its ValueError from the next
            return e is not None and (e[0] == "HorovodInternalError" or e[0] == "ValueError" and "Horovod" in e[1])
        assert all(horovods(errors.get(cluster.engine_of(r))) for r in (0, 1)), (errors, cause)
    finally:
        lab.restore("h2")
    cluster.restart()
    assert [o["slot"] for o in cluster.view.apply_sync(whoami)] == EXPECTED
    assert cluster.wait(cluster.view.apply_async(allreduce_many, 20), timeout=300) == [20] * 4


@pytest.mark.timeout(400)   # backend="mpi" first probes Horovod's build (imports torch and TF): slow under load
def test_dead_sshd_before_start_is_a_clear_error_and_starts_nothing():
    with netlab.start(hosts=2) as lab2:
        lab2._sshd["h2"].kill()
        lab2._sshd["h2"].wait()
        before = set(psutil.Process().children(recursive=True))
        for backend in ("gloo", "mpi"):
            with pytest.raises(kc.ClusterError, match=r"cannot reach h2 over SSH .*Nothing was started"):
                kc.start(n=4, backend=backend, hosts=lab2, timeout=TIMEOUT, quiet=True)
        # the SSH check's session on h1 ends a moment after its client (sshd's per-connection child): wait for it
        assert not wait_until_empty(lambda: live(set(psutil.Process().children(recursive=True)) - before))
        assert not lab_processes(lab2)
