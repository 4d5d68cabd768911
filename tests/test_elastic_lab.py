"""Elastic Horovod (kit.mnist.elastic, scripts/train_keras_mnist.py --elastic): host discovery, the event arithmetic,
the lesson's check, and run_on_lab's driver handling on a stand-in lab. The live run, a job that loses h2's link
mid-training, carries on alone and takes h2 back, is notebook 04's elastic section (checked by elastic.check)."""
import json
import os
import socket
import time
from pathlib import Path

import pytest

from kit import netlab
from kit.mnist import elastic
from kit.netlab import lab as netlab_lab

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(30)
def test_live_hosts_are_those_whose_ssh_port_answers():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert elastic.live_hosts(["127.0.0.1:2", "localhost:1"], port=port) == ["127.0.0.1:2", "localhost:1"]
    assert elastic.live_hosts(["127.0.0.1:2"], port=port, timeout=0.5) == []     # closed now: nobody answers


@pytest.mark.timeout(60)
@pytest.mark.engines
def test_discovery_script_lists_the_first_host_alone_then_the_live_hosts(tmp_path):
    import subprocess
    path = elastic.discovery_script(str(tmp_path), ["127.0.0.1:1", "no-such-host.invalid:4"])
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(elastic.__file__)))
    outs = [subprocess.run([path], capture_output=True, text=True, timeout=30, env=env) for _ in range(2)]
    assert [p.returncode for p in outs] == [0, 0], [p.stderr for p in outs]
    sshd_here = elastic.live_hosts(["127.0.0.1:1"]) == ["127.0.0.1:1"]          # port 22 on this machine
    assert outs[0].stdout.split() == ["127.0.0.1:1"]           # first call: rank 0's host, whatever answers
    assert outs[1].stdout.split() == (["127.0.0.1:1"] if sshd_here else [])


def test_summarize_counts_lost_batches_from_the_restored_count():
    ev = [{"t": 0, "event": "start", "size": 2, "done": 0}]
    ev += [{"t": 1 + i, "event": "batch", "size": 2, "done": i + 1} for i in range(27)]       # cut after 27
    ev += [{"t": 40, "event": "start", "size": 1, "done": 20}]                                  # last commit: 20
    ev += [{"t": 41 + i, "event": "batch", "size": 1, "done": 21 + i} for i in range(30)]
    ev += [{"t": 80, "event": "start", "size": 2, "done": 50}]                                  # rejoin at a commit
    ev += [{"t": 81 + i, "event": "batch", "size": 2, "done": 51 + i} for i in range(5)]
    ev += [{"t": 90, "event": "epoch", "size": 2, "done": 55, "accuracy": 0.9}, {"t": 91, "event": "end",
                                                                                  "size": 2, "done": 55}]
    s = elastic.summarize(ev, t_cut=28.5, t_restore=75)
    assert [(r["size_before"], r["size_after"], r["lost_batches"]) for r in s["resets"]] == [(2, 1, 7), (1, 2, 0)]
    assert s["lost_batches"] == [7]
    assert s["seconds_to_carry_on"] == 41 - 28.5 and s["seconds_to_rejoin"] == 81 - 75
    assert s["batches_at_size"] == {1: 30, 2: 32} and s["final_accuracy"] == 0.9 and s["finished"]
    assert s["pauses"] == [{"t": 27, "seconds": 14}, {"t": 70, "seconds": 11}]      # no batch for > 1 s


def test_cutting_the_host_that_runs_horovodrun_is_refused():
    class Lab:
        hosts = ["h1", "h2"]
    for bad in ("h1", "h9"):
        with pytest.raises(ValueError, match="give a lab host other than h1"):
            elastic.run_on_lab(Lab(), cut=bad)


def test_the_check_passes_the_committed_run_and_names_what_a_broken_one_breaks():
    """Notebook 04's elastic section calls elastic.check on its live run (under `make test`, as root, with the lab
    still up: nothing of the job may be left on the hosts); here on the committed run and on broken copies."""
    import copy
    run = json.loads((REPO / "results" / "elastic.json").read_text())["runs"][0]
    elastic.check(run)
    bad = copy.deepcopy(run)
    alone = [e for e in bad["events"] if e["event"] == "batch" and e["size"] < len(bad["hosts"])]
    alone[1]["host"] = bad["cut"]                        # the cut host trained while cut off
    alone[3]["size"] = len(bad["hosts"])                 # and the job grew back for one batch in between
    bad["lost_batches"], bad["final_accuracy"] = [bad["commit_every"]], 0.3
    with pytest.raises(AssertionError) as e:
        elastic.check(bad)
    msg = str(e.value)
    assert "job sizes went" in msg and "trained while cut off" in msg, msg
    assert "batches lost at the cut" in msg and "accuracy 0.3" in msg, msg


class _Lab:
    """A stand-in with the lab's own wait for leftover jobs (kit.netlab.Lab.jobs_left) over fixed pids."""
    hosts = ["h1", "h2"]
    jobs_left = netlab.Lab.jobs_left

    def __init__(self, left):
        self.left = left

    def job_pids(self):
        return self.left


def test_the_check_names_what_a_job_left_on_the_hosts(monkeypatch):
    run = json.loads((REPO / "results" / "elastic.json").read_text())["runs"][0]
    elastic.check(run, _Lab({"h1": set(), "h2": set()}))
    waits = []
    monkeypatch.setattr(netlab_lab.time, "sleep", waits.append)
    t = iter(range(0, 1000, 5))
    monkeypatch.setattr(netlab_lab.time, "monotonic", lambda: next(t))
    with pytest.raises(AssertionError, match=r"left on the hosts \(pids\): \{'h2': \{4242\}\}"):
        elastic.check(run, _Lab({"h1": set(), "h2": {4242}}))
    assert waits == [0.5] * 3                            # it waited until 20 s of the stand-in clock had passed


FAKE_JOB = r'''
import json, os, sys, time
events, flags = sys.argv[sys.argv.index("--events") + 1], sys.argv[1]
done = 0
def write(event, size, **extra):
    with open(events, "a") as f:
        row = {"t": time.time(), "event": event, "size": size, "host": "h1", "done": done, **extra}
        f.write(json.dumps(row) + "\n")
def batches(size, n):
    global done
    for _ in range(n):
        done += 1
        write("batch", size)
        time.sleep(0.01)
def wait_for(name):
    while not os.path.exists(os.path.join(flags, name)):
        time.sleep(0.05)
write("start", 2); batches(2, 30)
wait_for("cut"); done -= 3; write("start", 1); batches(1, 45)
wait_for("restore"); write("start", 2); batches(2, 5)
write("epoch", 2, accuracy=0.9); write("end", 2)
print("done: elastic training ended on 2 worker(s) after", done, "batches", flush=True)
time.sleep(600)            # horovodrun that does not exit after the training ended
'''


class FakeLab:
    """Stands in for a lab: `launch` starts FAKE_JOB, which follows cut and restore through flag files."""
    def __init__(self, folder):
        self.hosts, self.rate, self.dir, self.flags, self.killed = ["h1", "h2"], "1gbit", str(folder), folder, []
        self.proc = None

    def launch_env(self):
        return {"PATH": os.environ["PATH"]}

    def launch(self, host, cmd, cwd=None, env=None, **popen_kw):
        import subprocess
        import sys
        self.proc = subprocess.Popen([sys.executable, "-c", FAKE_JOB, str(self.flags), *cmd], **popen_kw)
        return self.proc

    def cut(self, host):
        (self.flags / "cut").touch()

    def restore(self, host):
        (self.flags / "restore").touch()

    def kill_jobs(self):
        self.killed.append(time.time())


@pytest.mark.timeout(60)
@pytest.mark.engines
def test_a_driver_that_lingers_after_training_ended_is_stopped_and_the_run_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(elastic, "DRIVER_GRACE", 1.0)
    lab = FakeLab(tmp_path)
    t0 = time.time()
    run = elastic.run_on_lab(lab, cut="h2", cut_after=25, restore_after=30, timeout=40)
    assert time.time() - t0 < 20                          # not the 40 s timeout: stopped after the 1 s grace
    assert run["driver_exit"] < 0 and run["finished"] and lab.killed and lab.proc.poll() is not None
    assert run["lost_batches"] == [3] and run["final_accuracy"] == 0.9
