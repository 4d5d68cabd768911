"""torchrun across lab hosts (notebook 05): the same DDP script on every host, one node per host, c10d rendezvous on
h1; a host cut mid-run ends in torchrun's elastic restart on the others (resumed from the last checkpoint).

    run = kit.ddp.torchrun.run_on_lab(lab, steps=40)                        # 3 hosts, 3 nodes, one rank each
    run = kit.ddp.torchrun.run_on_lab(lab, steps=40, cut="h3", cut_after=10)  # --nnodes=2:3: carry on with 2
    run["events"]          # rank 0's log: per step its world size, torchrun's restart count, the loss
    kit.checks.show(kit.ddp.torchrun.claims(run, lab))   # the section's checks; check(run, lab) raises on a miss

The training (`python -m kit.ddp.torchrun`, what torchrun starts on each node) is notebook 05's MLP under
`DistributedDataParallel` over Gloo (kit.ddp.schemes' model and batches), with a checkpoint on the shared file system
every `ckpt_every` steps. A host whose link is cut stops answering: the survivors' allreduce fails after the
process group's timeout, their torchrun agents restart the workers, the c10d rendezvous drops the silent node once
its heartbeats are old, and the new, smaller world resumes from the checkpoint.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from kit.checks import Check, table

PORT = 29400                    # the c10d store, on h1 (inside its namespace)
RDZV_CONF = "join_timeout=60,last_call_timeout=2,read_timeout=10"
# Each round of the rendezvous gets a fresh store for the workers (rank 0's worker hosts it). By default torchrun
# shares the agent's store across restarts, and its keys outlive the round (pytorch/pytorch#135712): after a cut,
# a restarted worker can read the previous round's address of rank 0 ("Connection refused"), fail, and make the
# other agent restart too; on a busy machine that chase used up --max-restarts in 3 of 6 runs here.
CONTRADICTS = "this run contradicts the torchrun section's lesson:"      # check()'s message starts so
ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1",
       "LOGLEVEL": "WARNING"}


def command(lab, *, nnodes: str, steps: int, folder: str, timeout: float, ckpt_every: int, step_sleep: float,
            max_restarts: int) -> list[str]:
    """Return the torchrun command line every host runs (the same on each, as on a cluster)."""
    return ["torchrun", f"--nnodes={nnodes}", "--nproc-per-node=1", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={lab.addr_of('h1')}:{PORT}", "--rdzv-id=kit", f"--rdzv-conf={RDZV_CONF}",
            f"--max-restarts={max_restarts}", "--monitor-interval=1", "-m", "kit.ddp.torchrun",
            "--steps", str(steps), "--folder", folder, "--timeout", str(timeout), "--ckpt-every", str(ckpt_every),
            "--step-sleep", str(step_sleep)]


def read_events(path: str) -> list[dict]:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def run_on_lab(lab, steps: int = 40, cut: str | None = None, cut_after: int = 10, timeout: float = 15,
               ckpt_every: int = 5, step_sleep: float = 0.2, deadline: float = 300) -> dict:
    """Run the DDP job under torchrun on every lab host; with `cut`, pull that host's cable once rank 0 finished
    `cut_after` steps (`--nnodes=MIN:N` with MIN = N - 1, so that torchrun may carry on without it). Return
    {"events", "exit" (host -> torchrun's exit code, None if it had to be killed), "outputs", "seconds"}."""
    if cut is not None and cut not in lab.hosts[1:]:
        raise ValueError(f"cut={cut!r}: give a lab host other than h1 (h1 holds the rendezvous): {lab.hosts[1:]}")
    n = len(lab.hosts)
    folder = tempfile.mkdtemp(prefix="torchrun-", dir=os.path.join(lab.dir, "tmp"))
    events = os.path.join(folder, "events.jsonl")
    argv = command(lab, nnodes=f"{n - 1}:{n}" if cut else str(n), steps=steps, folder=folder, timeout=timeout,
                   ckpt_every=ckpt_every, step_sleep=step_sleep, max_restarts=3)
    procs, logs, t0, cut_at = {}, {}, time.time(), None
    try:
        for h in lab.hosts:
            logs[h] = open(os.path.join(folder, f"{h}.log"), "w")
            procs[h] = lab.launch(h, argv, env=ENV, stdout=logs[h], stderr=subprocess.STDOUT)
        waiting = set(lab.hosts) - {cut}                    # a cut host's torchrun never hears the end
        while any(procs[h].poll() is None for h in waiting) and time.time() - t0 < deadline:
            done = [e for e in read_events(events) if e["event"] == "step"]
            if cut and cut_at is None and done and done[-1]["step"] >= cut_after:
                lab.cut(cut)
                cut_at = time.time() - t0
            time.sleep(0.2)
        exit_codes = {h: p.poll() for h, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        if cut:
            lab.restore(cut)
        lab.kill_jobs()                                     # torchrun, its agents and workers on every host
        for f in logs.values():
            f.close()
    outputs = {h: open(os.path.join(folder, f"{h}.log"), errors="replace").read() for h in lab.hosts}
    out = {"events": read_events(events), "exit": exit_codes, "outputs": outputs, "seconds": time.time() - t0,
           "t_cut": cut_at, "cut": cut, "cut_after": cut_after if cut else None, "ckpt_every": ckpt_every,
           "steps": steps, "nnodes": n}
    shutil.rmtree(folder, ignore_errors=True)
    return out


def summarize(run: dict) -> dict:
    """World sizes in order, restarts, the step each restart resumed from, and whether every step was trained."""
    ev = run["events"]
    steps = [e for e in ev if e["event"] == "step"]
    sizes = [s["world"] for i, s in enumerate(steps) if i == 0 or s["world"] != steps[i - 1]["world"]]
    starts = [e for e in ev if e["event"] == "start"]
    return {"world_sizes": sizes, "restarts": max((e["restart"] for e in starts), default=0),
            "resumed_from": [e["resume_step"] for e in starts[1:]],
            "finished": any(e["event"] == "end" for e in ev), "last_step": steps[-1]["step"] if steps else None,
            "final_loss": steps[-1]["loss"] if steps else None}


def claims(run: dict, lab=None) -> list[Check]:
    """Notebook 05's torchrun section checked on `run` (from `run_on_lab`): the hosts that were not cut ended with
    exit code 0, rank 0 (which logs) sat on h1, the rendezvous host, and the job trained every step. Without a cut:
    one world of every host, no restart. With a cut: the world went from every host to one fewer, through at least
    one restart, and the first restart resumed from the last checkpoint (a multiple of `ckpt_every`, from the cut's
    step to one interval on: rank 0 polls its log and the survivors train until their allreduce times out). With
    `lab` (the run's, still up): no process of the job is left on its hosts."""
    s, n, every, at = summarize(run), run["nnodes"], run["ckpt_every"], run["cut_after"]
    kept = [code for h, code in run["exit"].items() if h != run["cut"]]
    sizes, want = " → ".join(map(str, s["world_sizes"])), " → ".join(map(str, [n, n - 1] if run["cut"] else [n]))
    rank0 = sorted({e.get("host") for e in run["events"]})
    out = [Check("hosts kept, nonzero exit codes", sum(c != 0 for c in kept), 0, all(c == 0 for c in kept)),
           Check("rank 0's host", ", ".join(map(str, rank0)), "h1", rank0 == ["h1"]),
           Check("last step trained", s["last_step"] if s["finished"] else "not ended", run["steps"],
                 s["finished"] and s["last_step"] == run["steps"]),
           Check("world sizes", sizes, want, sizes == want),
           Check("restarts", s["restarts"], "≥ 1" if run["cut"] else 0,
                 s["restarts"] >= 1 if run["cut"] else s["restarts"] == 0)]
    if run["cut"]:
        first = s["resumed_from"][0] if s["resumed_from"] else None
        out.append(Check("first restart resumed from step", "none" if first is None else first,
                         f"a multiple of {every} in {at}–{at + every}",
                         first is not None and first % every == 0 and at <= first <= at + every))
    if lab is not None:
        left = lab.jobs_left()
        out.append(Check("processes left on the hosts", sum(len(p) for p in left.values()), 0, not left))
    return out


def check(run: dict, lab=None) -> None:
    """Raise AssertionError with the table of the section's checks (see claims) when one of them does not hold."""
    found = claims(run, lab)
    if not all(c.held for c in found):
        raise AssertionError(f"{CONTRADICTS}\n{table(found)}")


# ------------------------------------------------------------------------------- what torchrun runs on each node
def train(steps: int, folder: str, timeout: float, ckpt_every: int, step_sleep: float):
    """One rank of the DDP job: resume from the checkpoint if there is one, train to `steps`, rank 0 logging."""
    import datetime
    import socket

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from kit.ddp import schemes as exp
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = dict(exp.CFG, batch=32)
    model = exp.make_model(cfg)
    opt = exp.sgd(model.parameters(), cfg)
    ckpt, start = os.path.join(folder, "ckpt.pt"), 0
    if os.path.exists(ckpt):
        state = torch.load(ckpt, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
    ddp = DDP(model)
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))

    def log(**event):
        if rank == 0:
            with open(os.path.join(folder, "events.jsonl"), "a") as f:
                f.write(json.dumps({"t": time.time(), "world": world, "restart": restart,
                                    "host": socket.gethostname(), **event}) + "\n")
    log(event="start", resume_step=start)
    for step in range(start, steps):
        x, y = exp.batch(cfg, step, rank, world)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        time.sleep(step_sleep)
        if rank == 0 and (step + 1) % ckpt_every == 0:
            tmp = ckpt + ".tmp"
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step + 1}, tmp)
            os.replace(tmp, ckpt)                     # never a half-written checkpoint
        log(event="step", step=step + 1, loss=loss.item())
    log(event="end")
    dist.destroy_process_group()


def main(argv=None):
    ap = argparse.ArgumentParser(description="one rank of kit.ddp.torchrun's DDP job (started by torchrun)")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--folder", required=True)
    ap.add_argument("--timeout", type=float, default=15)
    ap.add_argument("--ckpt-every", type=int, default=5)
    ap.add_argument("--step-sleep", type=float, default=0.0)
    a = ap.parse_args(argv)
    train(a.steps, a.folder, a.timeout, a.ckpt_every, a.step_sleep)


if __name__ == "__main__":
    sys.exit(main())
