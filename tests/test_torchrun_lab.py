"""torchrun across 3 lab hosts (kit.bench.torchrun, notebook 05 section 8): the DDP job on one node per host with the
c10d rendezvous on h1, and a host cut mid-run: torchrun's elastic restart carries on with 2 nodes from the last
checkpoint and finishes; never a hang, nothing left on the hosts.

Needs root (network namespaces): CI runs as root; without root these are skipped with the reason."""
import time

import pytest

from kit import netlab
from kit.bench import torchrun


def test_a_cut_host_must_not_be_the_rendezvous_host():
    class Lab:
        hosts = ["h1", "h2", "h3"]
    for bad in ("h1", "h9"):
        with pytest.raises(ValueError, match="give a lab host other than h1"):
            torchrun.run_on_lab(Lab(), cut=bad)


def test_the_command_is_the_same_on_every_host():
    class Lab:
        def addr_of(self, h):
            return "198.18.0.2"
    argv = torchrun.command(Lab(), nnodes="2:3", steps=9, folder="/x", timeout=15, ckpt_every=3, step_sleep=0,
                            max_restarts=3)
    assert argv[:6] == ["torchrun", "--nnodes=2:3", "--nproc-per-node=1", "--rdzv-backend=c10d",
                        "--rdzv-endpoint=198.18.0.2:29400", "--rdzv-id=kit"]
    assert "--max-restarts=3" in argv and argv[argv.index("-m") + 1] == "kit.bench.torchrun"


@pytest.fixture(scope="module")
def lab():
    with netlab.start(hosts=3) as lab:
        yield lab


def nothing_left_on(lab) -> bool:
    sshd = {p.pid for p in lab._sshd.values()}
    deadline = time.time() + 20
    while any(netlab.ns_pids(lab.ns(h)) - sshd for h in lab.hosts) and time.time() < deadline:
        time.sleep(0.5)
    return not any(netlab.ns_pids(lab.ns(h)) - sshd for h in lab.hosts)


@pytest.mark.requires_root
@pytest.mark.timeout(300)
def test_torchrun_trains_on_three_hosts(lab):
    run = torchrun.run_on_lab(lab, steps=12, step_sleep=0.0, ckpt_every=4)
    s = torchrun.summarize(run)
    print(f"\ntorchrun on 3 hosts: {run['seconds']:.1f} s, {s}")
    assert run["exit"] == {"h1": 0, "h2": 0, "h3": 0}, run["outputs"]
    assert s["world_sizes"] == [3] and s["restarts"] == 0 and s["finished"] and s["last_step"] == 12
    assert {e["host"] for e in run["events"]} == {"h1"}               # rank 0 on the rendezvous host
    assert nothing_left_on(lab)


@pytest.mark.requires_root
@pytest.mark.timeout(400)
def test_a_cut_host_ends_in_an_elastic_restart_on_the_others_from_the_last_checkpoint(lab):
    run = torchrun.run_on_lab(lab, steps=24, cut="h3", cut_after=8, ckpt_every=4, step_sleep=0.1)
    s = torchrun.summarize(run)
    print(f"\ntorchrun, h3 cut after step 8 ({run['t_cut']:.1f} s): {run['seconds']:.1f} s, {s}")
    assert run["exit"]["h1"] == 0 and run["exit"]["h2"] == 0, run["outputs"]
    assert s["world_sizes"] == [3, 2] and s["restarts"] >= 1 and s["finished"] and s["last_step"] == 24
    first_after = next(e for e in run["events"] if e["event"] == "start" and e["restart"] >= 1)
    assert first_after["resume_step"] % 4 == 0 and 8 <= first_after["resume_step"] <= 12   # the last checkpoint
    assert nothing_left_on(lab)
