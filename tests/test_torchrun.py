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


def _missed(run, lab=None) -> set[str]:
    return {c.name for c in torchrun.claims(run, lab) if not c.held}


def test_the_checks_hold_on_a_cut_run_and_name_what_a_broken_one_breaks():
    torchrun.check(CUT_RUN)
    found = torchrun.claims(CUT_RUN)
    assert all(c.held for c in found) and len(found) == 6
    s = torchrun.summarize(CUT_RUN)
    assert s["world_sizes"] == [3, 2] and s["last_step"] == CUT_RUN["steps"] == 24   # what the recording holds
    bad = copy.deepcopy(CUT_RUN)
    bad["exit"]["h2"] = 1
    first_restart = next(e for e in bad["events"] if e["event"] == "start" and e["restart"] >= 1)
    first_restart["resume_step"] = 2                     # not a checkpoint (every 4), and before the cut
    bad["events"] = [e for e in bad["events"] if e["event"] != "end"]
    assert _missed(bad) == {"hosts kept, nonzero exit codes", "first restart resumed from step", "last step trained"}
    with pytest.raises(AssertionError) as e:
        torchrun.check(bad)
    msg = str(e.value)
    assert msg.startswith(torchrun.CONTRADICTS) and msg.count("| **no** |") == 3
    assert "| first restart resumed from step | 2 | a multiple of 4 in 8–12 | **no** |" in msg
    one_world = copy.deepcopy(CUT_RUN)
    one_world["events"] = [dict(e, world=3) for e in one_world["events"]]
    assert _missed(one_world) == {"world sizes"}
    uncut = copy.deepcopy(CUT_RUN)
    uncut["cut"] = None                                  # a run without a cut must not restart
    assert _missed(uncut) == {"world sizes", "restarts", "hosts kept, nonzero exit codes"}   # h3 too, then
    elsewhere = copy.deepcopy(CUT_RUN)
    elsewhere["events"][-1]["host"] = "h2"              # rank 0 logging from another host
    assert _missed(elsewhere) == {"rank 0's host"}


def test_the_check_with_the_lab_names_what_the_job_left_on_its_hosts():
    class Lab:                  # a stand-in: h3 still runs a process of the job after the wait
        def jobs_left(self, seconds=20):
            return {"h3": {4242}}
    assert _missed(CUT_RUN, Lab()) == {"processes left on the hosts"}
    with pytest.raises(AssertionError, match=r"\| processes left on the hosts \| 1 \| 0 \| \*\*no\*\* \|"):
        torchrun.check(CUT_RUN, Lab())
    Lab.jobs_left = lambda self, seconds=20: {}
    torchrun.check(CUT_RUN, Lab())
