"""torchrun across 3 lab hosts (kit.ddp.torchrun, notebook 05 section 8): the DDP job on one node per host with the
c10d rendezvous on h1, a host cut mid-run (torchrun's elastic restart carries on with 2 nodes from the last
checkpoint), checked by the section's own check, and nothing left on the hosts. The live run is notebook 05's own
(section 8, under `make test` at a smoke size; as root, CI): its cell raises on any claim `torchrun.check(run, lab)`
names. Here the check is tested on a recorded cut run (tests/data/torchrun_cut_run.json, a run of
`run_on_lab(lab, steps=24, cut="h3", cut_after=8, ckpt_every=4, step_sleep=0.1)` on this machine, torchrun's output
left out) and on broken copies of it."""
import copy
import json
from pathlib import Path

import pytest

from kit import checks
from kit.ddp import torchrun


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
    assert "--max-restarts=3" in argv and argv[argv.index("-m") + 1] == "kit.ddp.torchrun"


CUT_RUN = json.loads((Path(__file__).parent / "data" / "torchrun_cut_run.json").read_text())


def test_the_check_passes_a_cut_run_and_names_what_a_broken_one_breaks():
    torchrun.check(CUT_RUN)
    s = torchrun.summarize(CUT_RUN)
    assert s["world_sizes"] == [3, 2] and s["last_step"] == CUT_RUN["steps"] == 24   # what the recording holds
    bad = copy.deepcopy(CUT_RUN)
    bad["exit"]["h2"] = 1
    first_restart = next(e for e in bad["events"] if e["event"] == "start" and e["restart"] >= 1)
    first_restart["resume_step"] = 2                     # not a checkpoint (every 4), and before the cut
    bad["events"] = [e for e in bad["events"] if e["event"] != "end"]
    with pytest.raises(AssertionError) as e:
        torchrun.check(bad)
    msg = str(e.value)
    assert "exit codes" in msg and "resumed from step 2" in msg and "ended: False" in msg and msg.count("\n- ") == 3
    one_world = copy.deepcopy(CUT_RUN)
    one_world["events"] = [dict(e, world=3) for e in one_world["events"]]
    with pytest.raises(AssertionError, match=r"world sizes \[3\] with \d+ restart\(s\), not \[3, 2\]"):
        torchrun.check(one_world)
    uncut = copy.deepcopy(CUT_RUN)
    uncut["cut"] = None                                  # a run without a cut must not restart
    with pytest.raises(AssertionError, match=r"world sizes \[3, 2\] with \d+ restart\(s\), not \[3\] with none"):
        torchrun.check(uncut)


def test_the_check_with_the_lab_names_what_the_job_left_on_its_hosts(monkeypatch):
    class Lab:                  # a stand-in: h3 still runs a process of the job after the wait
        def jobs_left(self, seconds=20):
            return {"h3": {4242}}
    with pytest.raises(AssertionError, match=r"the job left processes on the lab's hosts: \{'h3': \{4242\}\}"):
        torchrun.check(CUT_RUN, Lab())
    Lab.jobs_left = lambda self, seconds=20: {}
    torchrun.check(CUT_RUN, Lab())


def test_the_verdict_says_what_the_run_did_and_why_it_did_not_hold():
    run = {**copy.deepcopy(CUT_RUN), "outputs": {"h1": "x" * 5000 + "the end of h1"}}
    ok = torchrun.run_check(run, torchrun.claims(run))
    text = checks.markdown([ok])
    assert ok.held and "world sizes 3 → 2, 1 restart(s), resumed from step 8, last step 24 of 24" in text
    assert "the job loses h3, restarts on h1 and h2 from its last checkpoint and finishes" in text
    assert torchrun.h1_output(run, ok.held) == ""
    run["exit"]["h2"] = 1
    broken = torchrun.claims(run)
    with pytest.raises(AssertionError, match=r"exit codes \{'h1': 0, 'h2': 1, 'h3': None\}"):
        torchrun.check(run)                                # check() raises with the same claims
    bad = torchrun.run_check(run, broken)
    text = checks.markdown([bad])
    assert not bad.held and "**did not hold** on this run: world sizes 3 → 2" in text
    assert "because exit codes {'h1': 0, 'h2': 1, 'h3': None}: every host but the cut one" in text
    tail = torchrun.h1_output(run, bad.held)
    assert "torchrun's own output on h1 (the end)" in tail and tail.endswith("the end of h1\n```")
    assert len(tail) < 3100                                # the last 3,000 characters only
    two = torchrun.run_check(run, ["first claim", "second claim"])
    assert two.reason == "first claim; second claim"
