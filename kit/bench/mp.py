"""`python -m kit.bench mp`: notebook 06's experiments (kit.mp) at benchmark size: tensor parallelism checked and
counted on 4 gloo engines, both pipeline schedules against one process, the bubble and activations swept, torch's
schedules side by side, the placement on a two-level lab (root), the memory levers → results/mp.json, results/mp.png,
results/mp_placement.png, docs/benchmarks/mp.md."""
from __future__ import annotations

SETTINGS = {
    "tiny": dict(ps=(2,), ms=(1, 2), reps=1, tf=0.002, tb=0.004, lab_reps=0, lab_ms=()),
    "quick": dict(ps=(2, 3, 4), ms=(1, 4, 16), reps=2, tf=0.03, tb=0.06, lab_reps=3, lab_ms=(4,)),
    "full": dict(ps=(2, 3, 4), ms=(1, 2, 4, 8, 16), reps=5, tf=0.03, tb=0.06, lab_reps=8, lab_ms=(4, 16)),
}
TP = dict(d=64, hidden=256, batch=32)
TP_ODD = dict(d=30, hidden=77, batch=9)


def engines_part(s: dict, n: int = 4) -> dict:
    """Everything that runs on n local gloo engines."""
    from kit import cluster as kc
    from kit.bench import say
    from kit.mp import experiment as ex
    with kc.start(n=n, backend="gloo", quiet=True) as c:
        c.init_process_group()
        say("mp: tensor parallelism (even and odd sizes)")
        tp, odd = ex.tp_check(c, cfg=TP), ex.tp_check(c, cfg=TP_ODD)
        say("mp: both schedules against one process")
        grads = ex.grads_check(c, p=n, m=6)
        say(f"mp: the sweep, p in {s['ps']}, m in {s['ms']}, {s['reps']} repeats")
        sweep = ex.sweep(c, ps=s["ps"], ms=s["ms"], cfg={"reps": s["reps"], "tf": s["tf"], "tb": s["tb"]})
        say("mp: torch.distributed.pipelining side by side")
        torch_pp = ex.torch_side_by_side(c, p=2, m=4, cfg={"reps": max(2, s["reps"]), "tf": s["tf"], "tb": s["tb"]})
    p, m = max(s["ps"]), max(x for x in s["ms"] if x <= 8)
    sweep["timelines"] = {k: v for k, v in sweep["timelines"].items() if k.endswith(f":{p}:{m}")}
    return {"n": n, "tp": tp, "tp_odd": odd, "grads": grads, "sweep": sweep, "torch_pp": torch_pp,
            "timeline_key": [p, m]}


def lab_part(s: dict) -> dict | None:
    """The placement on 2 lab hosts x 2 engines at 1 Gbit/s, then both schedules' bubble there, p = 2 (both stages
    on h1) and 4 (stages 0, 1 on h1, 2, 3 on h2) (None without root)."""
    from kit import cluster as kc, netlab
    from kit.bench import say
    from kit.mp import experiment as ex, lab as mplab
    if netlab.why_not():
        say(f"mp: no lab ({netlab.why_not()}): the placement is not run")
        return None
    say("mp: placement on 2 lab hosts x 2 engines at 1gbit")
    with netlab.start(hosts=2, rate="1gbit") as lab:
        with kc.start(n=4, backend="gloo", hosts=lab, quiet=True) as c:
            c.init_process_group()
            out = mplab.placement(c, cfg={"reps": s["lab_reps"]}, rate="1gbit")
            if s["lab_ms"]:
                say(f"mp: the bubble on the lab, p in (2, 4), m in {s['lab_ms']}")
                out["sweep"] = ex.sweep(c, ps=(2, 4), ms=s["lab_ms"], cfg={"reps": s["reps"], "tf": s["tf"],
                                                                            "tb": s["tb"]})
                out["sweep"]["timelines"] = {}               # the engines' sweep keeps the timelines drawn
            return out


def levers(blocks: int = 8, batch: int = 256, d: int = 256, steps: int = 20) -> dict:
    """Notebook 06's stack in this process: its memory (plain, checkpointing, bf16) and the losses of `steps` Adam
    steps in float32 and bf16 on a teacher's targets."""
    from kit.mp import lessons, memory
    x, y = memory.teacher_task(batch, d)
    out = {k: memory.measure(memory.stack(blocks, d), x, y, **kw, reps=5)
           for k, kw in (("plain", {}), ("checkpoint", {"checkpoint": True}), ("bf16", {"bf16": True}))}
    out["loss_fp32"] = memory.train_losses(memory.stack(blocks, d), x, y, steps)
    out["loss_bf16"] = memory.train_losses(memory.stack(blocks, d), x, y, steps, bf16=True)
    out["formula"] = lessons.activation_bytes(blocks, batch, d, 4 * d)
    out["cfg"] = {"blocks": blocks, "batch": batch, "d": d, "steps": steps}
    return out


def bench(out_dir, quick: bool = False, tiny: bool = False):
    """Run notebook 06's experiments with the benchmark's settings; save the figures; return (result, summary)."""
    s = SETTINGS["tiny" if tiny else "quick" if quick else "full"]
    x = engines_part(s)
    x["placement"] = lab_part(s) if s["lab_reps"] else None
    if x["placement"] is None:
        from kit import netlab
        x["placement_note"] = "a tiny run has none" if not s["lab_reps"] else f"no lab here: {netlab.why_not()}"
    x["levers"] = levers()
    if not tiny:
        save_figures(x, out_dir)
    return x, summary(x)


def save_figures(x: dict, out_dir):
    """results/mp.png (bubble, activations, timelines) and results/mp_placement.png."""
    from kit.plots import mp as mplots
    from kit.plots.style import figure
    p, m = x["timeline_key"]
    fig, ax = figure(2, 2, figsize=(12, 7))
    mplots.plot_bubble(x["sweep"]["rows"], ax=ax[0, 0])
    mplots.plot_peak_activations(x["sweep"]["rows"], p=p, ax=ax[0, 1])
    for a, name in zip(ax[1], ("afab", "1f1b")):
        mplots.plot_pipeline_timeline(x["sweep"]["timelines"][f"{name}:{p}:{m}"],
                                      title=f"{mplots.NAMES[name]}, p = {p}, m = {m}", ax=a)
    fig.tight_layout()
    fig.savefig(out_dir / "mp.png", dpi=110)
    if x["placement"]:
        fig, ax = figure(2, 1, figsize=(10, 3.4))
        mplots.plot_placement(x["placement"], ax=ax[0])
        fig.tight_layout()
        fig.savefig(out_dir / "mp_placement.png", dpi=110)


def summary(x: dict) -> str:
    """The one-line summary: the run's key numbers, then the checks (kit.mp.lessons, kit.checks)."""
    from kit import checks
    from kit.mp import lessons
    lv, every = x["levers"], lessons.bench_checks(x)
    ratio = {k: lv[k]["activations"] / lv["plain"]["activations"] for k in ("checkpoint", "bf16")}
    out = (f"mp: {x['n']} gloo engines; activations {lv['plain']['activations'] / 2**20:.1f} MiB for one process, "
           f"checkpointing {ratio['checkpoint']:.2f}x, bf16 {ratio['bf16']:.2f}x; bubble at worst "
           f"{next(c for c in every if c.name.startswith('bubble vs')).measured:.0%} from (p-1)/(m+p-1)")
    if not x.get("placement"):
        out += f"; placement on the lab: not run ({x.get('placement_note', 'needs root')})"
    return out + f"; checks {checks.summary_line(every)}"


def blocks(x: dict) -> list[str]:
    """The blocks of docs/benchmarks/mp.md: the settings, the TP table, the sweep table, the placement, levers."""
    from kit import checks
    from kit.mp.lessons import table, worst_tp
    m, tp, odd, t, lv = x["machine"], x["tp"], x["tp_odd"], x["torch_pp"], x["levers"]
    out = [f"Measured on {m['cpu_cores']} CPU cores, PyTorch {m['versions']['torch']}, {m['date'][:10]} "
           f"({x['seconds']:.0f} s)"]
    torch = [r["torch_diff"] if r["torch_error"] is None else "refused" for r in (tp, odd)]
    out.append(table([("unsharded", "—", tp["ms"]["full"]), ("kit.mp.tensor", worst_tp(tp), tp["ms"]["kit"]),
                      ("parallelize_module", torch[0], tp["ms"]["torch"] or "—"),
                      (f"odd sizes {odd['cfg']['d']}, {odd['cfg']['hidden']}: kit", worst_tp(odd), "—"),
                      ("odd sizes: parallelize_module", torch[1], "—")],
                     ("block", "largest difference", "fwd + bwd ms")))
    out.append(table([(r["p"], r["m"], r["schedule"], r["bubble"], r["model"], 1e3 * r["step_s"],
                       1e3 * r["model_step_s"], r["peak_bytes"], r["mb_bytes"], r["peak_model"])
                      for r in x["sweep"]["rows"]],
                     ("p", "m", "schedule", "bubble", "(p−1)/(m+p−1)", "step ms", "model step ms",
                      "bytes held at peak per stage", "one micro-batch's", "formula (micro-batches)")))
    out.append(table([(k, 1e3 * v["step_s"], v["err"]) for k, v in t["rows"].items()]
                     + [("formula (m+p−1)(t_f+t_b)", 1e3 * t["model_step_s"], "—")],
                     ("torch schedule", "step ms", "gradients vs one process")))
    pl = x.get("placement")
    if pl:
        from kit.mp.lab import claims
        out.append(table([(r["label"], r["step_ms"], r["model_step_ms"], round(r["nic_tx"]), r["model_tx"])
                          for r in pl["rows"]], ("placement", "step ms", "model step ms", "bytes per host NIC",
                                                 "model")) + "\n\n" + checks.table(claims(pl)))
    else:
        out.append(f"Not run: {x.get('placement_note', 'the placement needs root (kit.netlab)')}.")
    out.append(table([(k, lv[k]["activations"], lv[k]["copies"], lv[k]["ms"]) for k in ("plain", "checkpoint", "bf16")],
                     ("", "activations at peak (B)", "weight copies (B)", "fwd + bwd ms")) + "\n\n"
               + table([(k, lv[k][0], lv[k][-1]) for k in ("loss_fp32", "loss_bf16")], ("", "first loss", "last loss")))
    return out
