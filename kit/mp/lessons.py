"""Notebook 06's lessons, each checked on its run as a kit.checks.Check; notebook 06 and `python -m kit.bench mp`
render them with kit.checks (one verdict sentence: held, or did not hold … because …).

    display(Markdown(kit.checks.markdown(tp_checks(mine, odd))))      # the learner's TP layers: equal, bytes
    display(Markdown(kit.checks.markdown(sweep_checks(sweep))))       # the bubble, activations held per stage

Section 1's memory table and note (memory_table, memory_note) and section 3's comparison with PyTorch's
parallelize_module (tp_table, torch_odd_note, unsharded_check) are written here too.
"""
from __future__ import annotations

from kit.checks import Check

TOL = 1e-5               # float32: a parallel computation equals one process's within this
PARTS = ("params", "grads", "optimizer", "activations")     # what a step holds (kit.mp.memory.measure's keys)


def _mib(b: float) -> str:
    """Return `b` bytes in MiB, one decimal."""
    return f"{b / 2**20:.1f} MiB"


def memory_table(rows: dict[str, dict], budget: float) -> str:
    """Return section 1's Markdown table: per row (name -> bytes of each of PARTS) its parts, total and whether it
    fits a device of `budget` bytes."""
    table = ["| | parameters | gradients | Adam state | activations | total | fits the budget? |",
             "|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        total = sum(r[k] for k in PARTS)
        table.append(f"| {name} | " + " | ".join(_mib(r[k]) for k in PARTS)
                     + f" | {_mib(total)} | {'yes' if total <= budget else '**no**'} |")
    return "\n".join(table)


def memory_note(one: dict, zero: dict, budget: float, batch: int, n: int) -> str:
    """Return section 1's note: what one process holds (`one`), against a device of `budget` bytes what ZeRO-3 over
    n ranks holds per rank (`zero`, kit.mp.model.memory_per_rank's), and whether that fits."""
    state, zero_state = (sum(d[k] for k in ("params", "grads", "optimizer")) for d in (one, zero))
    zero_total = zero_state + zero["activations"]
    return (f"Measured in one process: parameters, gradients and Adam state {_mib(state)}, activations "
            f"{_mib(one['activations'])} for a batch of {batch}. Against a device of half that ({_mib(budget)}): "
            f"ZeRO-3 over {n} ranks brings the state down to {_mib(zero_state)} but keeps all "
            f"{_mib(zero['activations'])} of activations, {_mib(zero_total)} in all: "
            + ("it does **not** fit, " if zero_total > budget else
               "it fits here, but only just: a larger batch would not; ")
            + "splitting the model itself divides the activations too.")


def worst_tp(r: dict) -> float:
    """Return the largest difference of a TP run (outputs, input gradient, weight gradients) to one process."""
    return max(max(d["out"], d["dx"], d["grads"]) for d in r["diff"])


def tp_checks(mine: dict, odd: dict, tol: float = TOL) -> list[Check]:
    """The column- then row-parallel MLP (kit.mp.experiment.tp_check's result on even and odd sizes) equals the
    unsharded block; forward and backward allreduce once each, handing 2 × batch × d × 4 bytes per step."""
    worst, odd_worst = worst_tp(mine), worst_tp(odd)
    cfg, ocfg = mine["cfg"], odd["cfg"]
    equal = Check(
        "equal to the unsharded block",
        measured=f"outputs, input gradient and weight gradients within {worst:.1e} (d = {cfg['d']}, hidden = "
                 f"{cfg['hidden']}) and {odd_worst:.1e} on odd sizes (d = {ocfg['d']}, hidden = {ocfg['hidden']})",
        bound=f"{tol:.0e} of one process", held=mine["ok"] and odd["ok"],
        reason="" if mine["ok"] and odd["ok"] else
        f"the largest differences per rank were {mine['diff'] if not mine['ok'] else odd['diff']}")
    n = len(mine["diff"])
    ok = mine["allreduces"] == 2 and mine["handed"] == mine["model_handed"]
    bytes_ = Check(
        "one allreduce forward, one backward",
        measured=f"{mine['allreduces']} allreduces handed {mine['handed']:,} bytes per step",
        bound=f"2 × batch × d × 4 = 2 × {cfg['batch']} × {cfg['d']} × 4 = {mine['model_handed']:,} bytes",
        held=ok, reason="" if ok else f"the block called allreduce {mine['allreduces']} times, handing "
                                      f"{mine['handed'] - mine['model_handed']:+,} bytes more than the model",
        detail=f"By the ring (notebook 03) each of the {n} ranks sends 2(N−1)/N of that, {mine['sent']:,.0f} bytes, "
               f"whatever the hidden size: the hidden activations ({cfg['batch']} × {cfg['hidden']} floats, split "
               f"{n} ways) never move. Each rank holds {max(mine['held']):,} of the block's {mine['full']:,} parameter "
               "bytes (the row layer's bias is whole on every rank)")
    return [equal, bytes_]


def tp_table(mine: dict) -> str:
    """Return section 3's Markdown table: the largest difference to one process and the forward + backward time of
    the unsharded block, the learner's Column + Row, and PyTorch's parallelize_module (or why it refused)."""
    ms = mine["ms"]
    torch_row = (f"{mine['torch_diff']:.1e} | {ms['torch']:.2f} ms |" if mine["torch_error"] is None else
                 f"refused: {mine['torch_error']} | — |")
    return "\n".join([
        "| | largest difference to one process | forward + backward |", "|---|---|---|",
        f"| unsharded, one process per rank | — | {ms['full']:.2f} ms |",
        f"| your Column + Row | {worst_tp(mine):.1e} | {ms['kit']:.2f} ms |",
        f"| `parallelize_module(ColwiseParallel, RowwiseParallel)` | {torch_row}"])


def torch_odd_note(odd: dict, n: int) -> str:
    """Return what PyTorch's parallelize_module did on the odd sizes (`odd`, tp_check's run over n ranks)."""
    return (f"On odd sizes (hidden {odd['cfg']['hidden']} over {n} ranks) PyTorch "
            + (f"refused: `{odd['torch_error']}` — its row-wise layer needs the hidden size to divide by the ranks, "
               "yours does not." if odd["torch_error"] else f"also matched ({odd['torch_diff']:.1e})."))


def unsharded_check(ms: dict) -> Check:
    """On this CPU the small block is faster unsharded than split (`ms`: tp_check's forward + backward times)."""
    held = ms["full"] < ms["kit"]
    return Check("a block this small, faster unsharded", measured=f"unsharded {ms['full']:.2f} ms, your Column + Row "
                 f"{ms['kit']:.2f} ms", bound="unsharded faster on this CPU", held=held, reason="" if held else
                 "the split matmuls saved more than the allreduces cost on this run",
                 detail=("The allreduces cost more than the split matmuls save. " if held else "")
                 + "Tensor parallelism pays when a block's matmuls are large, on fast links (a GPU node's NVLink): "
                   "section 10 shows what a slow link does to it")


def schedule_checks(played: dict[str, bool], grads: dict, settings: str = "p = 2..4, m = 1, 3, 8") -> list[Check]:
    """The learner's schedules, played with fixed times (`played`: name -> bubble and activations as the formulas
    say) and run on the engines (kit.mp.experiment.grads_check: every stage's gradients against one process)."""
    out = []
    for name, label in (("afab", "AFAB"), ("1f1b", "1F1B")):
        out.append(Check(f"{label} played", measured=f"bubble and activations held per stage at {settings}",
                         bound="(p−1)/(m+p−1) and model.peak_in_flight exactly", held=played[name],
                         reason="" if played[name] else "your order differs from the formulas at some p, m: play "
                                                         "it with pp.simulate and compare the events"))
    worst = max(e for v in grads["errs"].values() for e in v)
    out.append(Check("one process's gradients",
                     measured=f"every stage's gradients within {worst:.1e} ({grads['p']} stages, {grads['m']} "
                              "micro-batches)",
                     bound=f"{grads['tol']:.0e} of one process on the whole batch", held=grads["ok"],
                     reason="" if grads["ok"] else f"the largest difference per stage was {grads['errs']}"))
    return out


def worst_fit(sweep: dict) -> dict | None:
    """Return the sweep's row with m >= p furthest from (p−1)/(m+p−1), relatively (None: no such row)."""
    fits = [r for r in sweep["rows"] if r["m"] >= r["p"]]
    return max(fits, key=lambda r: abs(r["bubble"] - r["model"]) / r["model"]) if fits else None


def fit_error(sweep: dict) -> tuple[float | None, int]:
    """Return the bubble's worst relative distance from (p−1)/(m+p−1) over the sweep's rows with m >= p (None: no
    such row), and how many rows that is."""
    w = worst_fit(sweep)
    n = sum(1 for r in sweep["rows"] if r["m"] >= r["p"])
    return (None if w is None else abs(w["bubble"] - w["model"]) / w["model"]), n


def bubble_check(sweep: dict, tol: float = 0.15, name: str = "bubble") -> Check:
    """For m >= p, the measured bubble is within `tol` (relative) of (p−1)/(m+p−1)."""
    w = worst_fit(sweep)
    if w is None:
        return Check(name, measured="no setting with m ≥ p in this sweep", bound="(p−1)/(m+p−1)", held=False,
                     reason="the sweep had no m ≥ p: run it with more micro-batches")
    err, n = fit_error(sweep)
    lo, hi = w["bubble_range"]
    held = err <= tol
    return Check(
        name, measured=f"at worst {100 * err:.0f}% from the formula over {n} settings with m ≥ p (p = {w['p']}, "
                           f"m = {w['m']}, {w['schedule']}: {w['bubble']:.3f} measured, range {lo:.3f}–{hi:.3f}, "
                           f"against {w['model']:.3f})",
        bound=f"within {100 * tol:.0f}% of (p−1)/(m+p−1)", held=held,
        reason="" if held else "the measured idle time also holds each hop's transfer (the wait in recv), which the "
                               "formula leaves out (it takes communication as free); it weighs most where the "
                               "bubble is smallest (large m)",
        detail="More micro-batches shrink the bubble; more stages grow it. AFAB and 1F1B have the same bubble: 1F1B "
               "saves memory, not time")


def memory_checks(sweep: dict, p: int, m: int) -> list[Check]:
    """Activations held per stage: 1F1B at most p micro-batches, AFAB all m, each stage exactly as the formula says
    (shown at stages p and micro-batches m of the sweep)."""
    rows = sweep["rows"]
    a = next(r for r in rows if (r["p"], r["m"], r["schedule"]) == (p, m, "afab"))
    o = next(r for r in rows if (r["p"], r["m"], r["schedule"]) == (p, m, "1f1b"))
    one = [r for r in rows if r["schedule"] == "1f1b"]
    over = [r for r in one if max(r["peak"]) > r["p"]]
    short = [r for r in rows if r["schedule"] == "afab" and r["peak"][0] != r["m"]]
    off = [r for r in rows if r["peak"] != r["peak_model"]]
    where = lambda bad: ", ".join(f"p = {r['p']}, m = {r['m']} held {r['peak']}" for r in bad[:3])  # noqa: E731
    return [
        Check("1F1B holds at most p", measured=f"at p = {p}, m = {m} its stages held {o['peak']} micro-batches "
                                               f"({o['peak_bytes'][0]:,} bytes on stage 0)",
              bound="≤ p on every stage, over the whole sweep", held=not over,
              reason=f"{where(over)}" if over else ""),
        Check("AFAB holds all m", measured=f"at p = {p}, m = {m} its stages held {a['peak']} micro-batches "
                                           f"({a['peak_bytes'][0]:,} bytes on stage 0)",
              bound="m on stage 0, over the whole sweep", held=not short, reason=f"{where(short)}" if short else ""),
        Check("as the formula says", measured=f"{len(rows) - len(off)} of {len(rows)} runs held exactly "
                                              "model.peak_in_flight on every stage",
              bound="all of them", held=not off, reason=where(off) if off else "")]


def torch_check(t: dict, tol: float = TOL) -> Check:
    """torch.distributed.pipelining's schedules (kit.mp.experiment.torch_side_by_side) give one process's
    gradients on the same stages."""
    worst = max(r["err"] for r in t["rows"].values())
    return Check("torch's schedules", measured=f"ScheduleGPipe and Schedule1F1B within {worst:.1e} of one process",
                 bound=f"{tol:.0e}", held=worst < tol,
                 reason="" if worst < tol else "torch's gradients differ from one process's on this run")


def torch_table(mine: dict[str, dict], t: dict) -> str:
    """Return section 7's table: your schedules' step (rows by schedule) beside torch's, its gradients' error, and
    the formula's step."""
    from kit.plots.mp import NAMES as names
    lines = ["| schedule | yours: step | torch: step | torch's gradients vs one process |", "|---|---|---|---|"]
    lines += [f"| {names[s]} | {1e3 * mine[s]['step_s']:.0f} ms | {1e3 * t['rows'][s]['step_s']:.0f} ms "
              f"| {t['rows'][s]['err']:.1e} |" for s in ("afab", "1f1b")]
    return "\n".join(lines) + f"\n\nThe formula's step, (m+p−1)(t_f+t_b): {1e3 * t['model_step_s']:.0f} ms."


def hybrid_checks(dpp: dict[str, dict]) -> list[Check]:
    """DP × PP (kit.mp.hybrid.dp_pp_check per schedule) trains to one process's weights on the global batch."""
    out = []
    for name, r in dpp.items():
        worst = max(r["errs"])
        out.append(Check(f"DP × PP, {name}", measured=f"{r['replicas']} pipelines × {r['p']} stages, {r['steps']} "
                                                     f"steps: every rank's weights within {worst:.1e} of one process",
                         bound=f"{r['tol']:.0e}", held=r["ok"],
                         reason="" if r["ok"] else f"the largest difference per rank was {r['errs']}"))
    return out


def lab_checks(place: dict) -> list[Check]:
    """The lab run's lessons (kit.mp.lab.placement, with the bubble swept there when it was): NIC bytes against the
    model, TP across the slow link slower than PP across it by the model's amount, the same loss either way, and
    the bubble with stages on two hosts."""
    from kit.mp.lab import claims
    return claims(place) + ([bubble_check(place["sweep"], name="bubble, on the lab")] if place.get("sweep") else [])


def lever_checks(plain: dict, ckpt: dict, bf16: dict, loss32: float, loss16: float) -> list[Check]:
    """Activation checkpointing: memory down, compute up; bf16 autocast: the saved activations halved (±0.1)."""
    a, t = ckpt["activations"] / plain["activations"], ckpt["ms"] / plain["ms"]
    b = bf16["activations"] / plain["activations"]
    ck_ok = a < 1 and t > 1
    return [
        Check("checkpointing", measured=f"{a:.2f}× the activations for {t:.2f}× the time",
              bound="activations below 1×, time above 1×", held=ck_ok,
              reason="" if ck_ok else ("it did not save activations" if a >= 1 else
                                       "recomputing took no measurable time on this run")),
        Check("bf16 autocast", measured=f"{b:.2f}× the activations' bytes, a loss {abs(loss16 - loss32):.1e} from "
                                        "float32's", bound="0.5× ± 0.1", held=abs(b - 0.5) < 0.1,
              reason="" if abs(b - 0.5) < 0.1 else "some saved tensors stayed float32 under autocast",
              detail=f"On this CPU bf16 took {bf16['ms'] / plain['ms']:.2f}× the time (a CPU with bf16 matrix "
                     "instructions gains speed, one without does not; the weights, their gradients and Adam's state "
                     "stay float32 either way)")]


def lever_table(plain: dict, ckpt: dict, bf16: dict, loss32: float, loss16: float) -> str:
    """Return section 9's table: activations saved, forward + backward time and the loss, per lever."""
    return "\n".join([
        "| | activations saved | forward + backward | loss after 20 steps |", "|---|---|---|---|",
        f"| float32 | {_mib(plain['activations'])} | {plain['ms']:.0f} ms | {loss32:.5f} |",
        f"| checkpointing every block | {_mib(ckpt['activations'])} | {ckpt['ms']:.0f} ms | (the same computation) |",
        f"| bf16 autocast | {_mib(bf16['activations'])} | {bf16['ms']:.0f} ms | {loss16:.5f} |"])


def bench_checks(x: dict) -> list[Check]:
    """Every lesson `python -m kit.bench mp` measured (results/mp.json), as notebook 06 checks it."""
    sweep = x["sweep"]
    p, m = x.get("timeline_key") or (max(r["p"] for r in sweep["rows"]), max(r["m"] for r in sweep["rows"]))
    big = max(r["m"] for r in sweep["rows"])
    lv = x["levers"]
    g = x["grads"]
    worst = max(e for v in g["errs"].values() for e in v)
    out = tp_checks(x["tp"], x["tp_odd"]) + [Check(
        "one process's gradients", measured=f"AFAB and 1F1B within {worst:.1e}", bound=f"{g['tol']:.0e}",
        held=g["ok"], reason="" if g["ok"] else f"the largest difference per stage was {g['errs']}")]
    out += [bubble_check(sweep), *memory_checks(sweep, p, big), torch_check(x["torch_pp"])]
    if x.get("placement"):
        out += lab_checks(x["placement"])
    return out + lever_checks(lv["plain"], lv["checkpoint"], lv["bf16"], lv["loss_fp32"], lv["loss_bf16"])
