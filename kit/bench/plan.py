"""python -m kit.bench plan: kit.plan's predictions against the lab's committed runs (results/ps.json, network.json,
ddp_lab.json, mp.json) and against published scaling efficiencies (kit.plan.published): results/plan.json,
results/plan.png and the summary line. It measures nothing itself: it reads the results folder it writes into,
falling back to the repository's results/ for the runs it predicts.
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

from kit.plan import lab, published

TARGETS = {"median_abs_error": 0.15, "worst_abs_error": 0.35, "memory_abs_error": 0.10, "published_points": 10}
REPO_RESULTS = Path(__file__).resolve().parents[2] / "results"


def experiment(results: Path) -> dict:
    """Predict every lab point and every published case; return the rows and their summaries."""
    pts, mem = lab.points(results), lab.memory_points(results)
    by_source = defaultdict(list)
    for p in pts:
        by_source[p["source"]].append(p)
    ranks = lab.ranking(results)
    return {"lab": {"points": pts, "summary": lab.summary(pts),
                    "by_source": {s: lab.summary(v) for s, v in by_source.items()}},
            "memory": {"points": mem, "summary": lab.summary(mem)},
            "ranking": {"pairs": ranks, "held": sum(r["held"] for r in ranks), "n": len(ranks)},
            "published": published.cases(), "targets": TARGETS}


def plot(x: dict, path: Path):
    """Predicted against measured seconds of every lab point, log-log, one colour per source."""
    from kit import plots
    fig, ax = plots.figure(figsize=(5.5, 4.5))
    ax = ax[0, 0]
    by = defaultdict(list)
    for p in x["lab"]["points"]:
        by[p["source"]].append(p)
    for source, ps in by.items():
        ax.loglog([p["measured_s"] for p in ps], [p["predicted_s"] for p in ps], "o", ms=4, label=source, alpha=0.7)
    lo = min(min(p["measured_s"], p["predicted_s"]) for p in x["lab"]["points"])
    hi = max(max(p["measured_s"], p["predicted_s"]) for p in x["lab"]["points"])
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    ax.set_xlabel("measured s"), ax.set_ylabel("predicted s (kit.plan)"), ax.legend(fontsize=8)
    fig.tight_layout(), fig.savefig(path, dpi=100)


def bench(out_dir, quick: bool = False, tiny: bool = False):
    """Predict the lab's points and the published cases; write plan.png; return (result, summary)."""
    out_dir = Path(out_dir)
    results = out_dir if (out_dir / "network.json").exists() else REPO_RESULTS
    x = experiment(results)
    if x["lab"]["points"]:
        plot(x, out_dir / "plan.png")
    return x, summary(x)


def summary(x: dict) -> str:
    """The summary line: lab median and worst |error|, memory worst, ranking, published within ±10 points."""
    s, m, pub = x["lab"]["summary"], x["memory"]["summary"], x["published"]
    scored = [r for r in pub if r["error_points"] is not None]
    med = statistics.median(abs(r["error_points"]) for r in scored) if scored else float("nan")
    return (f"plan: lab {s['n']} points, median |error| {100 * (s['median_abs_error'] or 0):.1f}% (target ≤ 15%), "
            f"worst {100 * (s['worst_abs_error'] or 0):.0f}% (target ≤ 35%); memory worst "
            f"{100 * (m['worst_abs_error'] or 0):.1f}% over {m['n']}; ranking {x['ranking']['held']}/"
            f"{x['ranking']['n']} pairs; published {sum(r['held'] for r in pub)}/{len(pub)} within target "
            f"(median {med:.1f} points)")


def _md(header, rows) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(out + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


def _f(v, spec=".3g"):
    return "—" if v is None else format(v, spec)


def blocks(x: dict) -> list[str]:
    """docs/benchmarks/plan.md's blocks: the published table, the lab's summary by source, every lab point, the
    memory points, the ranking pairs that did not hold."""
    yes = {True: "yes", False: "**no**"}
    pub = _md(("case", "published %", "predicted", "error (points)", "within target", "compute s", "exposed comm s",
               "why it misses"),
              [(r["case"], _f(r["published"]), _f(r["predicted"]), _f(r["error_points"], "+.1f"), yes[r["held"]],
                _f(r["compute_s"]), _f(r["exposed_comm_s"]), r["why"]) for r in x["published"]])
    by = _md(("source", "points", "median abs error", "worst abs error"),
             [(s, v["n"], _f(v["median_abs_error"], ".1%"), _f(v["worst_abs_error"], ".0%"))
              for s, v in {**x["lab"]["by_source"], "all": x["lab"]["summary"]}.items()])
    pts = _md(("source", "point", "measured ms", "predicted ms", "error"),
              [(p["source"], p["point"], _f(1e3 * p["measured_s"]), _f(1e3 * p["predicted_s"]),
                _f(p["error"], "+.0%")) for p in x["lab"]["points"]])
    mem = _md(("point", "measured bytes", "predicted bytes", "error"),
              [(p["point"], p["measured_bytes"], round(p["predicted_bytes"]), _f(p["error"], "+.2%"))
               for p in x["memory"]["points"]])
    rk = _md(("faster measured", "slower measured", "predicted in that order"),
             [(r["faster_measured"], r["slower_measured"], yes[r["held"]]) for r in x["ranking"]["pairs"]
              if not r["held"]])
    return [pub, by, pts, mem, rk, f"{x['ranking']['held']} of {x['ranking']['n']}"]
