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


def levers() -> dict:
    """Activation checkpointing and bf16 autocast on notebook 06's stack, in this process."""
    import torch
    from kit.mp import memory
    torch.manual_seed(0)
    x, y = torch.randn(256, 256), torch.randn(256, 256)
    out = {k: memory.measure(memory.stack(), x, y, **kw, reps=5)
           for k, kw in (("plain", {}), ("checkpoint", {"checkpoint": True}), ("bf16", {"bf16": True}))}
    out["loss_fp32"] = memory.train_losses(memory.stack(), x, y)[-1]
    out["loss_bf16"] = memory.train_losses(memory.stack(), x, y, bf16=True)[-1]
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
    """The one-line summary: the run's key numbers, then each lesson's verdict (kit.mp.lessons, kit.checks)."""
    from kit import checks
    from kit.mp import lessons
    lv = x["levers"]
    pct = lambda err: "n/a" if err is None else f"{100 * err:.0f}%"   # noqa: E731
    err, n_fits = lessons.fit_error(x["sweep"])
    out = (f"mp: {x['n']} gloo engines; TP MLP {x['tp']['allreduces']} allreduces handing {x['tp']['handed']:,} B per "
           f"block-step (model {x['tp']['model_handed']:,}); bubble at worst {pct(err)} from (p-1)/(m+p-1) over "
           f"{n_fits} settings with m >= p")
    pl = x.get("placement")
    if pl:
        rows = {r["placement"]: r for r in pl["rows"]}
        a, b = rows["tp_in_host"], rows["tp_across"]
        out += (f"; 2 hosts x 2 engines at 1gbit: TP across {b['step_ms']:.0f} ms vs TP inside {a['step_ms']:.0f} ms "
                f"per step (difference {pl['delta_ms']:.0f} ms, model {pl['model_delta_ms']:.0f}), NIC bytes per host "
                f"{b['nic_tx'] / 1e6:.2f} vs {a['nic_tx'] / 1e6:.2f} MB")
        if pl.get("sweep"):
            err, n_fits = lessons.fit_error(pl["sweep"])
            out += f", bubble there at worst {pct(err)} over {n_fits} settings"
    else:
        out += f"; placement on the lab: not run ({x.get('placement_note', 'needs root')})"
    out += (f"; checkpointing {lv['checkpoint']['activations'] / lv['plain']['activations']:.2f}x the activations "
            f"for {lv['checkpoint']['ms'] / lv['plain']['ms']:.2f}x the time, bf16 "
            f"{lv['bf16']['activations'] / lv['plain']['activations']:.2f}x")
    return out + f"; checks {checks.summary_line(lessons.bench_checks(x))}"


def blocks(x: dict) -> list[str]:
    """The blocks of docs/benchmarks/mp.md: the settings, the TP table, the sweep table, the placement, levers."""
    m = x["machine"]
    tp = x["tp"]
    out = [f"Measured on {m['cpu_cores']} CPU cores, PyTorch {m['versions']['torch']}, {m['date'][:10]} "
           f"({x['seconds']:.0f} s)"]
    ms = tp["ms"]
    out.append("\n".join([
        "| | largest difference to one process | forward + backward (ms) |", "|---|---|---|",
        f"| unsharded | — | {ms['full']:.2f} |",
        f"| kit.mp.tensor (Column + Row) | {max(max(d['out'], d['dx'], d['grads']) for d in tp['diff']):.1e} | "
        f"{ms['kit']:.2f} |",
        "| parallelize_module | " + (f"{tp['torch_diff']:.1e} | {ms['torch']:.2f} |" if tp["torch_error"] is None
                                     else f"refused: {tp['torch_error']} | — |"),
        f"| odd sizes (d = {x['tp_odd']['cfg']['d']}, hidden = {x['tp_odd']['cfg']['hidden']}): kit | "
        f"{'equal' if x['tp_odd']['ok'] else 'NOT equal'} | — |",
        "| odd sizes: parallelize_module | " + (f"refused: {x['tp_odd']['torch_error']}" if x["tp_odd"]["torch_error"]
                                               else f"{x['tp_odd']['torch_diff']:.1e}") + " | — |"]))
    rows = ["| p | m | schedule | bubble measured (range) | (p−1)/(m+p−1) | step ms | model step ms | peak held per "
            "stage | peak bytes, stage 0 |", "|---|---|---|---|---|---|---|---|---|"]
    for r in x["sweep"]["rows"]:
        rows.append(f"| {r['p']} | {r['m']} | {r['schedule']} | {r['bubble']:.3f} ({r['bubble_range'][0]:.3f}–"
                    f"{r['bubble_range'][1]:.3f}) | {r['model']:.3f} | {1e3 * r['step_s']:.0f} | "
                    f"{1e3 * r['model_step_s']:.0f} | {r['peak']} | {r['peak_bytes'][0]:,} |")
    out.append("\n".join(rows))
    t = x["torch_pp"]
    out.append(f"p = {t['p']}, m = {t['m']}: torch ScheduleGPipe {1e3 * t['rows']['afab']['step_s']:.0f} ms "
               f"(gradients within {t['rows']['afab']['err']:.1e} of one process), Schedule1F1B "
               f"{1e3 * t['rows']['1f1b']['step_s']:.0f} ms ({t['rows']['1f1b']['err']:.1e}); the formula's step "
               f"{1e3 * t['model_step_s']:.0f} ms")
    pl = x.get("placement")
    if pl:
        from kit import checks
        from kit.mp.lessons import lab_checks
        prow = ["| placement | step ms (range) | model step ms | bytes sent per host NIC | model |",
                "|---|---|---|---|---|"]
        for r in pl["rows"]:
            lo, hi = r["step_ms_range"]
            prow.append(f"| {r['label']} | {r['step_ms']:.1f} ({lo:.1f}–{hi:.1f}) | {r['model_step_ms']:.1f} | "
                        f"{r['nic_tx']:,.0f} | {r['model_tx']:,} |")
        out.append("\n".join(prow) + "\n\n" + checks.markdown(lab_checks(pl)))
    else:
        out.append(f"Not run: {x.get('placement_note', 'the placement needs root (kit.netlab)')}.")
    lv = x["levers"]
    out.append("\n".join([
        "| | activations saved | forward + backward | loss after 20 Adam steps |", "|---|---|---|---|",
        f"| float32 | {lv['plain']['activations']:,} B | {lv['plain']['ms']:.0f} ms | {lv['loss_fp32']:.5f} |",
        f"| checkpointing every block | {lv['checkpoint']['activations']:,} B | {lv['checkpoint']['ms']:.0f} ms | — |",
        f"| bf16 autocast | {lv['bf16']['activations']:,} B | {lv['bf16']['ms']:.0f} ms | {lv['loss_bf16']:.5f} |"]))
    return out
