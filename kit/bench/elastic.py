"""`python -m kit.bench elastic`: notebook 04's elastic run on a 2-host lab (kit.mnist.elastic.run_on_lab),
repeated; elastic.png."""
from __future__ import annotations

import statistics
from pathlib import Path

from kit import netlab, plots
from kit.mnist import elastic


def bench(out_dir: Path, quick: bool) -> tuple[dict, str]:
    """`python -m kit.bench elastic`: the notebook's run on a 2-host lab, repeated; figure of the first run."""
    runs = []
    with netlab.start(hosts=2) as lab:
        for _ in range(1 if quick else 3):
            runs.append(elastic.run_on_lab(lab, cut_after=25))
    ax = plots.plot_elastic(runs[0], ax=plots.figure(figsize=(9, 3.4))[1][0, 0])
    ax.figure.savefig(out_dir / "elastic.png", dpi=110, bbox_inches="tight")
    carry, rejoin = (statistics.median(r[k] for r in runs) for k in ("seconds_to_carry_on", "seconds_to_rejoin"))
    lost = [b for r in runs for b in r["lost_batches"]]
    summary = (f"elastic: {len(runs)} run(s), 2 lab hosts at {runs[0]['rate']}: h1 carried on alone {carry:.1f} s "
               f"after h2's link was cut (median; Gloo timeout {elastic.GLOO_TIMEOUT} s), "
               f"losing {min(lost)}-{max(lost)} "
               f"batches (commit every {runs[0]['commit_every']}); h2 rejoined {rejoin:.1f} s after the restore; "
               f"final accuracy {min(r['final_accuracy'] for r in runs):.3f}-"
               f"{max(r['final_accuracy'] for r in runs):.3f}")
    return {"gloo_timeout_s": elastic.GLOO_TIMEOUT, "runs": runs}, summary
