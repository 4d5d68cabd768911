"""Elastic Horovod on the emulated-host lab: a training job that loses a host, carries on, and takes it back.

    python -m kit.mnist.elastic h1:1 h2:1          # horovodrun's --host-discovery-script: the hosts whose SSH answers
    run = kit.mnist.elastic.run_on_lab(lab)        # train on every host, cut h2's link, restore it: what happened
    kit.plots.plot_elastic(run)              # world size and batches done over time

The training itself is `python -m kit.mnist.train --elastic` (the Horovod lines a learner reads). Rank 0 writes
one JSON line per event to `--events`: "start" each time `hvd.elastic.run` (re)starts training (after a reset it
carries the restored, last committed batch count), "batch", "epoch", "end". Lost work is measured from those
lines: the batches done before a reset minus the count the reset restored.
"""
from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kit import scratch
from kit.mnist.script import REPO, TRAIN

PAUSE = 1.0           # s without a finished batch that counts as a pause of training (an epoch's end takes less)
# s: how long survivors wait in a collective for a peer behind a cut link (Horovod's default is 30). It also bounds
# the rendezvous after a reset, where a survivor waits for a restarted worker's TensorFlow to start: 10 s was too
# short on a busy 2-core machine (notebook 04 beside the lab's tests: "Wait timeout after 10 seconds for key(s)").
GLOO_TIMEOUT = 20
DRIVER_GRACE = 30      # s horovodrun gets to exit after rank 0 printed DONE; then it is stopped (see run_on_lab)
DONE = "done: elastic training ended"      # what the training script's rank 0 prints when training returned


class ElasticError(RuntimeError):
    """The elastic job failed or did not go through cut and restore; the message has horovodrun's output."""


# ---------------------------------------------------------------------------------- host discovery
def live_hosts(specs: list[str], port: int = 22, timeout: float = 1.0) -> list[str]:
    """Return the `host:slots` of `specs` whose SSH port accepts a TCP connection within `timeout` s."""
    from kit.cluster.remote import port_answers
    with ThreadPoolExecutor(len(specs) or 1) as pool:
        up = pool.map(lambda spec: port_answers(spec.split(":")[0], port, timeout), specs)
        return [s for s, ok in zip(specs, up) if ok]


def discover(specs: list[str], seen: str | None = None) -> list[str]:
    """What the discovery script prints. Horovod ranks hosts in the order discovery first listed them, and hosts
    first listed together in a random order (a set): so the first call (no `seen` file yet) lists the first
    host alone, and rank 0 stays on it, where horovodrun runs and the lab never cuts."""
    if seen and not os.path.exists(seen):
        Path(seen).touch()
        return specs[:1]
    return live_hosts(specs)


def discovery_script(folder: str, specs: list[str]) -> str:
    """Write an executable discovery script for horovodrun into `folder`; return its path."""
    path = Path(folder) / "discover-hosts.sh"
    seen = shlex.quote(str(Path(folder) / "discovered"))
    path.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m kit.mnist.elastic --seen {seen} "
                    f"{shlex.join(specs)}\n")
    path.chmod(0o755)
    return str(path)


# ---------------------------------------------------------------------------------- the event log
def event_log(state, path: str | None, hvd, batch: int):
    """Return a Keras callback that counts batches in `state.done` (so a reset restores it with the weights)
    and, on rank 0, appends the events to `path`. Put it before Horovod's CommitStateCallback."""
    import tensorflow as tf

    class EventLog(tf.keras.callbacks.Callback):
        def _write(self, event, **extra):
            if path and hvd.rank() == 0:
                with open(path, "a") as f:
                    f.write(json.dumps({"t": time.time(), "event": event, "size": hvd.size(),
                                        "host": socket.gethostname(),
                                        "done": state.done, **extra}) + "\n")

        def on_train_begin(self, logs=None):
            self._write("start", epoch=state.epoch)

        def on_train_batch_end(self, step, logs=None):
            state.done += 1
            self._write("batch", samples=hvd.size() * batch)

        def on_epoch_end(self, epoch, logs=None):
            self._write("epoch", epoch=state.epoch + 1, accuracy=float((logs or {}).get("accuracy", "nan")))

        def on_train_end(self, logs=None):
            self._write("end")
    return EventLog()


def read_events(path: str) -> list[dict]:
    """Return the events written so far (a line being written is left for the next read)."""
    try:
        lines = Path(path).read_text().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return out


def summarize(events: list[dict], t_cut: float | None = None, t_restore: float | None = None) -> dict:
    """Return the resets (size before/after, batches lost = done before − done restored), the pauses (no batch
    finished for more than PAUSE s) and the timings."""
    resets, last = [], None
    for e in events:
        if e["event"] == "start" and last is not None:
            resets.append({"t": e["t"], "size_before": last["size"], "size_after": e["size"],
                           "lost_batches": last["done"] - e["done"]})
        if e["event"] == "batch":
            last = e
    first_at = {}
    for e in events:
        if e["event"] == "batch":
            first_at.setdefault(e["size"], [])
            first_at[e["size"]].append(e["t"])

    def first_after(t, size):
        return next((x for x in first_at.get(size, []) if t is not None and x > t), None)

    sizes = [e["size"] for e in events if e["event"] == "batch"]
    times = [e["t"] for e in events if e["event"] == "batch"]
    pauses = [{"t": a, "seconds": b - a} for a, b in zip(times, times[1:]) if b - a > PAUSE]
    full = max(sizes) if sizes else 0
    shrunk, back = first_after(t_cut, full - 1), None
    if shrunk:
        back = first_after(max(t_restore or shrunk, shrunk), full)
    ends = [e for e in events if e["event"] == "epoch"]
    return {"resets": resets, "lost_batches": [r["lost_batches"] for r in resets if r["size_after"] < r["size_before"]],
            "seconds_to_carry_on": shrunk - t_cut if shrunk and t_cut else None,
            "seconds_to_rejoin": back - t_restore if back and t_restore else None,
            "batches_at_size": {s: sizes.count(s) for s in sorted(set(sizes))}, "pauses": pauses,
            "final_accuracy": ends[-1]["accuracy"] if ends else None,
            "finished": any(e["event"] == "end" for e in events)}


def check(run: dict, lab=None) -> None:
    """Raise AssertionError naming each claim of notebook 04's elastic section that `run` (from `run_on_lab`)
    breaks: the job ran on every host, on the first alone after the cut, then on every host again; after the cut
    only the first host trained; the survivor lost fewer batches than one commit interval; it carried on within
    Gloo's timeout (+60 s to re-form); the training finished and learned; the batch count adds up. With `lab`
    (still up): nothing of the job is left running on its hosts but their sshd."""
    bad = []
    batches = [e for e in run["events"] if e["event"] == "batch"]
    sizes = [e["size"] for e in batches]
    changes = [s for i, s in enumerate(sizes) if i == 0 or s != sizes[i - 1]]
    n = len(run["hosts"])
    if changes != [n, n - 1, n]:
        bad.append(f"job sizes went {changes}, not {[n, n - 1, n]} (all hosts, one fewer, all again)")
    after = {e["host"] for e in batches if run["t_cut"] < e["t"] and e["size"] < n}
    if run["cut"] in after:
        bad.append(f"the cut host {run['cut']} trained while cut off")
    if not (len(run["lost_batches"]) == 1 and 0 <= run["lost_batches"][0] < run["commit_every"]):
        bad.append(f"batches lost at the cut: {run['lost_batches']} (want one loss, below {run['commit_every']})")
    if run["seconds_to_carry_on"] is None or run["seconds_to_carry_on"] >= GLOO_TIMEOUT + 60:
        bad.append(f"carried on {run['seconds_to_carry_on']} s after the cut (Gloo's timeout is {GLOO_TIMEOUT} s)")
    if not run["finished"] or (run["final_accuracy"] or 0) <= 0.5:
        bad.append(f"finished {run['finished']}, last epoch's accuracy {run['final_accuracy']}")
    lost = sum(r["lost_batches"] for r in run["resets"])
    if batches and batches[-1]["done"] != sum(run["batches_at_size"].values()) - lost:
        bad.append(f"{batches[-1]['done']} batches done, not {sum(run['batches_at_size'].values())} run − {lost} lost")
    if lab is not None:
        if left := lab.jobs_left():
            bad.append(f"processes of the job left on the hosts (pids): {left}")
    if bad:
        raise AssertionError("this run contradicts the elastic section's lesson:\n- " + "\n- ".join(bad))


def run_checks(run: dict) -> list:
    """Return the elastic run's lessons as checks: fewer batches lost at the cut than one commit interval, the
    survivor carrying on within Gloo's timeout + 60 s (to re-form the ring), and the training learned."""
    from kit.checks import Check
    lost, k, carry, acc = run["lost_batches"], run["commit_every"], run["seconds_to_carry_on"], run["final_accuracy"]
    return [Check("batches lost at the cut", lost[0] if len(lost) == 1 else str(lost), f"< K = {k}",
                  len(lost) == 1 and 0 <= lost[0] < k),
            Check("seconds to carry on after the cut", round(carry or -1, 1), f"< {GLOO_TIMEOUT + 60} s",
                  carry is not None and carry < GLOO_TIMEOUT + 60, unit=" s"),
            Check("last epoch's training accuracy", round(100 * (acc or 0), 1), "> 50%", (acc or 0) > 0.5, unit="%")]


# ---------------------------------------------------------------------------------- the experiment
def run_on_lab(lab, cut: str = "h2", cut_after: int = 30, restore_after: int = 40, epochs: int = 8,
               train_samples: int = 4000, batch: int = 32, commit_every: int = 10, timeout: float = 600,
               dataset: str = "auto") -> dict:
    """Train elastically on every lab host (1 slot each), horovodrun on the first host; cut `cut`'s link after
    `cut_after` batches, restore it after `restore_after` more at the smaller size; return events and summary."""
    driver = lab.hosts[0]
    if cut == driver or cut not in lab.hosts:
        raise ValueError(f"cut={cut!r}: give a lab host other than {driver} (horovodrun runs there): "
                         f"one of {lab.hosts[1:]}")
    folder = scratch.make("elastic")
    events, log = os.path.join(folder, "events.jsonl"), os.path.join(folder, "horovodrun.log")
    train = ["--commit-every", str(commit_every), "--events", events, "--epochs", str(epochs),
             "--train-samples", str(train_samples), "--batch-size", str(batch), "--dataset", dataset]
    cmd, env = _horovodrun(lab, folder, train)
    times = {"cut": None, "restore": None}
    with open(log, "w") as out:
        p = lab.launch(driver, cmd, cwd=str(REPO), env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        _drive(p, lab, cut, cut_after, restore_after, events, log, timeout, times)
        ev = read_events(events)
        trained = DONE in Path(log).read_text(errors="replace")      # rank 0's training returned
        if p.returncode and not trained:
            raise ElasticError(f"the elastic job failed ({p.returncode}):\n{_tail(log)}")
        if times["restore"] is None:
            raise ElasticError(f"the elastic job ended before the host was cut and restored; raise epochs for a "
                               f"longer run:\n{_tail(log)}")
        # driver_exit: horovodrun's exit status. Not 0 only after rank 0's training had ended: < 0, the kit
        # stopped a horovodrun that did not exit within DRIVER_GRACE; > 0, horovodrun reported a worker's exit
        # status at shutdown (seen under load: the rejoined worker's SSH session ended with 255 as the job
        # wound down). Either way the training and its events are complete.
        return {"hosts": lab.hosts, "cut": cut, "rate": lab.rate, "commit_every": commit_every, "batch": batch,
                "t0": ev[0]["t"] if ev else None, "t_cut": times["cut"], "t_restore": times["restore"],
                "events": ev, "driver_exit": p.returncode, **summarize(ev, times["cut"], times["restore"])}
    finally:
        if times["cut"] and times["restore"] is None:
            lab.restore(cut)
        if p.poll() is None:
            p.kill()
            p.wait()
        if p.returncode:                      # stopped, or failed: what horovodrun started may be left on the hosts
            lab.kill_jobs()
        scratch.remove(folder)


def _horovodrun(lab, folder: str, train: list[str]) -> tuple[list[str], dict]:
    """Return elastic horovodrun's command on every lab host (1 slot each) and its environment; `train`: the
    training script's arguments after --elastic."""
    n, specs = len(lab.hosts), [f"{h}:1" for h in lab.hosts]
    # horovodrun notices a lost host when the SSH session that runs its worker ends: keepalives end it within
    # ~6 s of silence, as on a real cluster (without them a cut link leaves the session, and the job, waiting)
    os.makedirs(os.path.join(folder, "bin"))
    Path(folder, "bin", "ssh").write_text(f'#!/bin/sh\nexec {lab.dir}/bin/ssh -o ServerAliveInterval=2 '
                                          f'-o ServerAliveCountMax=3 "$@"\n')
    Path(folder, "bin", "ssh").chmod(0o700)
    env = {"HOROVOD_GLOO_TIMEOUT_SECONDS": GLOO_TIMEOUT, "PATH": f"{folder}/bin:{lab.launch_env()['PATH']}"}
    cmd = [os.path.join(os.path.dirname(sys.executable), "horovodrun"), "--gloo", "-np", str(n),
           "--min-np", "1", "--max-np", str(n), "--host-discovery-script", discovery_script(folder, specs),
           "--network-interface", "eth0",     # elastic horovodrun hangs without it (FACTS: lab recipe)
           "--blacklist-cooldown-range", "1", "2",  # a host that failed may come back (its link restored)
           sys.executable, *TRAIN, "--elastic", *train]
    return cmd, env


def _drive(p, lab, cut: str, cut_after: int, restore_after: int, events: str, log: str, timeout: float,
           times: dict) -> None:
    """Follow the running job's events until horovodrun exits: cut `cut` once `cut_after` batches ran at full size,
    restore it after `restore_after` batches at the smaller size (their times go in `times`). Stop a horovodrun
    that waits on DRIVER_GRACE after rank 0's training returned; raise ElasticError past `timeout`."""
    n = len(lab.hosts)
    deadline, t_done = time.time() + timeout, None
    while p.poll() is None and time.time() < deadline:
        if t_done is None and DONE in Path(log).read_text(errors="replace"):
            t_done = time.time()
        if t_done and time.time() > t_done + DRIVER_GRACE:
            # Rank 0's training returned, but horovodrun waits on: seen under load when a worker's SSH
            # session ended with 255 while the job wound down. The result is complete; stop the driver.
            p.kill()
            p.wait()
            return
        batches = [e for e in read_events(events) if e["event"] == "batch"]
        if times["cut"] is None and batches and batches[-1]["size"] == n and batches[-1]["done"] >= cut_after:
            lab.cut(cut)
            times["cut"] = time.time()
        elif times["cut"] and times["restore"] is None:
            small = [e for e in batches if e["t"] > times["cut"] and e["size"] < n]
            if len(small) >= restore_after:
                lab.restore(cut)
                times["restore"] = time.time()
        time.sleep(0.2)
    if p.poll() is None:
        raise ElasticError(f"the elastic job did not finish within {timeout:.0f} s:\n{_tail(log)}")


def _tail(path: str, n: int = 3000) -> str:
    try:
        return Path(path).read_text()[-n:]
    except OSError:
        return ""


if __name__ == "__main__":         # the discovery script: print the live hosts, one per line
    import argparse
    p = argparse.ArgumentParser(prog="python -m kit.mnist.elastic", description="print the hosts whose SSH answers")
    p.add_argument("--seen", help="a file made on the first call, which lists the first host alone")
    p.add_argument("specs", nargs="+", metavar="HOST:SLOTS")
    a = p.parse_args()
    print("\n".join(discover(a.specs, a.seen)))
