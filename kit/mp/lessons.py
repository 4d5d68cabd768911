"""Notebook 06's lessons, each checked on its run as numbers (kit.checks.Check); the notebook renders them with
kit.checks.show, `python -m kit.bench mp` stores them. The claims and their reasons are the notebook's Markdown.

    checks.show(tp_checks(ref, odd))              # the TP block equals the unsharded one; its allreduce bytes
    checks.show(memory_checks(sweep))             # AFAB and 1F1B: the bytes each stage kept alive, against the formula
    print(table(rows))                            # a list of dicts as a Markdown table of numbers
"""
from __future__ import annotations

from kit.checks import Check, fmt

TOL = 1e-5               # float32: a parallel computation equals one process's within this
MIB = 2 ** 20


def table(rows: list, header: tuple | None = None) -> str:
    """Return rows as a Markdown table, numbers formatted by kit.checks.fmt: dicts with the same keys (the header),
    or sequences under `header`."""
    header = header or tuple(rows[0])
    cells = [r.values() if isinstance(r, dict) else r for r in rows]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(fmt(v) for v in r) + " |" for r in cells])


def activation_bytes(blocks: int, batch: int, d: int, hidden: int, itemsize: int = 4) -> int:
    """Return what a stack of MLP blocks keeps for backward by the formula: per block its input (batch × d) and its
    hidden activations before and after GELU (2 × batch × hidden); then the loss's output and target (2 × batch × d)."""
    return itemsize * batch * (blocks * (d + 2 * hidden) + 2 * d)


def measured_check(name: str, measured: float, formula: float, tol: float = 0.01, unit: str = " MiB") -> Check:
    """Measured bytes against the formula's, within `tol` (relative); shown in MiB."""
    return Check(name, measured=measured / MIB, bound=formula / MIB, unit=unit,
                 held=abs(measured - formula) <= tol * formula)


def worst_tp(r: dict) -> float:
    """Return the largest difference of a TP run (outputs, input gradient, weight gradients) to one process."""
    return max(max(d["out"], d["dx"], d["grads"]) for d in r["diff"])


def tp_checks(r: dict, odd: dict, tol: float = TOL) -> list[Check]:
    """The column- then row-parallel MLP (kit.mp.experiment.tp_check on even and odd sizes) equals the unsharded
    block; one step hands 2 × batch × d × 4 bytes to allreduce; on a block this small, unsharded is faster."""
    return [Check("equal to the unsharded block", measured=max(worst_tp(r), worst_tp(odd)), bound=f"≤ {tol:g}",
                  held=r["ok"] and odd["ok"]),
            Check("allreduces per forward + backward", measured=r["allreduces"], bound=2, held=r["allreduces"] == 2),
            Check("bytes handed to allreduce", measured=r["handed"], bound=r["model_handed"], unit=" B",
                  held=r["handed"] == r["model_handed"]),
            Check("time split / unsharded", measured=r["ms"]["kit"] / r["ms"]["full"], bound="> 1",
                  held=r["ms"]["kit"] > r["ms"]["full"], unit="×")]


def grads_check(g: dict, name: str = "stage gradients vs one process") -> Check:
    """Every stage's gradients (kit.mp.experiment.grads_check) within its tolerance of one process's."""
    return Check(name, measured=max(e for v in g["errs"].values() for e in v), bound=f"≤ {g['tol']:g}", held=g["ok"])


def bubble_check(sweep: dict, tol: float = 0.15, name: str = "bubble vs (p−1)/(m+p−1) at worst (m ≥ p)") -> Check:
    """For m >= p, the measured bubble within `tol` (relative) of (p−1)/(m+p−1): the worst row's distance."""
    errs = [abs(r["bubble"] - r["model"]) / r["model"] for r in sweep["rows"] if r["m"] >= r["p"]]
    worst = max(errs) if errs else float("nan")
    return Check(name, measured=worst, bound=f"≤ {tol:g}", held=bool(errs) and worst <= tol)


def held_ratio(row: dict, stage: int) -> float:
    """Return the bytes a stage kept alive at its peak over the formula's: peak_in_flight × one micro-batch's."""
    return row["peak_bytes"][stage] / (row["peak_model"][stage] * row["mb_bytes"][stage])


def memory_checks(sweep: dict, p: int, m: int) -> list[Check]:
    """AFAB and 1F1B, the bytes each stage kept alive (kit.mp.pipeline.run_step: parameters excluded) in
    micro-batches' worth at (p, m), stage 0, against the formula (AFAB m, 1F1B min(m, p − s)); then over every
    run and stage of the sweep, the worst measured / formula."""
    out = []
    for name in ("afab", "1f1b"):
        r = next(r for r in sweep["rows"] if (r["p"], r["m"], r["schedule"]) == (p, m, name))
        held = r["peak_bytes"][0] / r["mb_bytes"][0]
        out.append(Check(f"{name.upper()} micro-batches held by stage 0 (p = {p} m = {m})", measured=held,
                         bound=r["peak_model"][0], held=abs(held - r["peak_model"][0]) <= 0.01 * r["peak_model"][0]))
    ratios = [held_ratio(r, s) for r in sweep["rows"] for s in range(r["p"])]
    out.append(Check(f"bytes held / formula's over {len(sweep['rows'])} runs and their stages",
                     measured=max(ratios, key=lambda v: abs(v - 1)), bound="1 ± 0.01",
                     held=all(abs(v - 1) <= 0.01 for v in ratios)))
    return out


def torch_check(t: dict, tol: float = TOL) -> Check:
    """torch.distributed.pipelining's schedules (kit.mp.experiment.torch_side_by_side) give one process's
    gradients on the same stages."""
    worst = max(r["err"] for r in t["rows"].values())
    return Check("torch's schedules vs one process", measured=worst, bound=f"≤ {tol:g}", held=worst <= tol)


def hybrid_checks(dpp: dict[str, dict]) -> list[Check]:
    """DP × PP (kit.mp.hybrid.dp_pp_check per schedule) trains to one process's weights on the global batch."""
    return [Check(f"DP × PP {name}: weights vs one process", measured=max(r["errs"]), bound=f"≤ {r['tol']:g}",
                  held=r["ok"]) for name, r in dpp.items()]


def lever_checks(plain: dict, ckpt: dict, bf16: dict, blocks: int, batch: int, d: int) -> list[Check]:
    """Checkpointing's peak against the formula (every block's input, plus one block's hidden activations while
    backward recomputes it), its time above plain; bf16's activations at half of float32's (±0.1)."""
    hidden = 4 * d
    peak = 4 * batch * (blocks * d + 2 * hidden)
    b = bf16["activations"] / plain["activations"]
    return [measured_check("checkpointing peak activations", ckpt["activations"], peak, tol=0.05),
            Check("checkpointing time / plain", measured=ckpt["ms"] / plain["ms"], bound="> 1",
                  held=ckpt["ms"] > plain["ms"], unit="×"),
            Check("bf16 activations / float32's", measured=b, bound="0.5 ± 0.1", held=abs(b - 0.5) <= 0.1, unit="×")]


def learning_checks(loss32: list[float], loss16: list[float], falls: float = 0.1, band: float = 2.0) -> list[Check]:
    """On a task that can be learned, float32's loss falls below `falls` of its start, and bf16's last loss is
    within `band`× of float32's either way."""
    f, r = loss32[-1] / loss32[0], loss16[-1] / loss32[-1]
    return [Check("float32 last loss / first", measured=f, bound=f"≤ {falls:g}", held=f <= falls),
            Check("bf16 last loss / float32's", measured=r, bound=f"{1 / band:g}–{band:g}",
                  held=1 / band <= r <= band)]


def bench_checks(x: dict) -> list[Check]:
    """Every lesson `python -m kit.bench mp` measured (results/mp.json), as notebook 06 checks it."""
    from kit.mp.lab import claims
    p, m = x["timeline_key"][0], max(r["m"] for r in x["sweep"]["rows"])
    lv = x["levers"]
    out = [measured_check("activations of one process", lv["plain"]["activations"], lv["formula"])]
    out += tp_checks(x["tp"], x["tp_odd"]) + [grads_check(x["grads"]), bubble_check(x["sweep"])]
    out += memory_checks(x["sweep"], p, m) + [torch_check(x["torch_pp"])]
    if x.get("placement"):
        pl = x["placement"]
        out += claims(pl) + ([bubble_check(pl["sweep"], name="bubble on the lab at worst")] if pl.get("sweep") else [])
    cfg = lv["cfg"]
    return out + lever_checks(lv["plain"], lv["checkpoint"], lv["bf16"], cfg["blocks"], cfg["batch"], cfg["d"]) \
        + learning_checks(lv["loss_fp32"], lv["loss_bf16"])


def show(rows: list[dict]) -> None:
    """Display rows as table() renders them (in a notebook)."""
    from IPython.display import Markdown, display
    display(Markdown(table(rows)))
