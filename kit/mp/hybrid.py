"""Data parallelism over pipeline parallelism: N/p pipelines of p stages, each on its slice of the global batch,
every stage's gradients averaged over its replicas, trained to the weights one process reaches on the whole batch.

    r = dp_pp_check(cluster, p=2, m=2, steps=3)      # 4 engines: pipelines (0, 1) and (2, 3); DP groups (0, 2), (1, 3)
"""
from __future__ import annotations

CFG = dict(d=32, mb=4, seed=0, lr=0.05)


def layout(rank: int, world: int, p: int) -> tuple[int, int, list[int], list[list[int]]]:
    """Return (stage, replica, my pipeline's ranks, every stage's DP group) for `rank` of `world` with p stages."""
    if world % p:
        raise ValueError(f"the world size {world} must divide by the stages p={p} (world = p x replicas)")
    stage, replica = rank % p, rank // p
    return stage, replica, [replica * p + s for s in range(p)], [[r * p + s for r in range(world // p)]
                                                                   for s in range(p)]


def engine_dp_pp(cfg: dict, p: int, m: int, steps: int, name: str = "1f1b") -> dict:
    """On every engine: `steps` SGD steps of DP x PP, and of one process on the whole batch; the largest
    difference between this stage's weights and the same layers of the one-process model."""
    import torch
    import torch.distributed as dist
    from kit.mp import pipeline as pp
    rank, world = dist.get_rank(), dist.get_world_size()
    stage, replica, pipe, groups = layout(rank, world, p)
    dp_groups = [dist.new_group(g) for g in groups]          # every rank creates every group, in the same order
    n_dp = world // p
    module = pp.make_model(p, cfg["d"], cfg["seed"])[stage]
    ref = pp.make_model(p, cfg["d"], cfg["seed"])
    opt = torch.optim.SGD(module.parameters(), lr=cfg["lr"])
    ref_opt = torch.optim.SGD(ref.parameters(), lr=cfg["lr"])
    for step in range(steps):
        x, y = pp.data(n_dp * m * cfg["mb"], cfg["d"], cfg["seed"] + step)     # the global batch
        rows = slice(replica * m * cfg["mb"], (replica + 1) * m * cfg["mb"])     # my pipeline's slice
        opt.zero_grad()
        pp.run_step(module, pp.schedule(name)(p, m, stage), stage=stage, p=p, ranks=pipe, shape=(cfg["mb"], cfg["d"]),
                    xs=x[rows].chunk(m) if stage == 0 else None, ys=y[rows].chunk(m) if stage == p - 1 else None)
        for prm in module.parameters():                       # the mean over the replicas of this stage
            dist.all_reduce(prm.grad, group=dp_groups[stage])
            prm.grad /= n_dp
        opt.step()
        ref_opt.zero_grad()
        pp.loss_fn(ref(x), y).backward()
        ref_opt.step()
    err = max(float((a - b).abs().max()) for a, b in zip(module.parameters(), ref[stage].parameters()))
    return {"rank": rank, "stage": stage, "replica": replica, "err": err}


def dp_pp_check(cluster, p: int = 2, m: int = 2, steps: int = 3, cfg: dict | None = None, tol: float = 1e-5,
                name: str = "1f1b") -> dict:
    """Train DP x PP on the cluster's engines against one process; return each rank's largest difference."""
    cfg = {**CFG, **(cfg or {})}
    out = cluster.wait(cluster.view.apply_async(engine_dp_pp, cfg, p, m, steps, name))
    return {"p": p, "replicas": cluster.size // p, "m": m, "steps": steps, "errs": [r["err"] for r in out],
            "ok": all(r["err"] <= tol for r in out), "tol": tol}
