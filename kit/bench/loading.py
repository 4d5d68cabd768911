"""`python -m kit.bench loading`: notebook 01's num_workers sweep (kit.data.pipeline.sweep_experiment) with
the benchmark's settings; loading.png; the W = 0 and best-W runs recorded with torch.profiler as Chrome traces
(loading_W0.json.gz, loading_W{best}.json.gz: open them in Perfetto or chrome://tracing) and loading_timeline.png
drawn from those traces."""
from __future__ import annotations

from pathlib import Path

from kit import checks
from kit.data import lesson, pipeline
from kit.plots import figure, plot_sweep, plot_traces


def bench(out_dir: Path, quick: bool) -> tuple[dict, str]:
    """Sweep num_workers on the default demo; trace W = 0 and the best W; write loading.png, the two traces and
    loading_timeline.png (from the traces); return (result, summary)."""
    steps, rounds = (12, 1) if quick else (30, 3)
    workers = (0, 1, 2) if quick else (0, 1, 2, 3, 4, 6)
    store, dataset, step = pipeline.setup(steps)
    alone = lesson.calibrate(step, dataset, pipeline.DEFAULT["batch_size"], sync=pipeline.sync_fn())
    with lesson.MachineLoad() as load:
        res = pipeline.sweep_experiment(dataset, step, workers, steps, pipeline.DEFAULT["batch_size"], rounds,
                                        fit_workers=(0, 2))
    lessons = lesson.sweep_checks(res, alone, load) + lesson.model_checks(res["rows"], res["fit"], res["fit_workers"])
    rows, best = res["rows"], res["best"]
    fig, axes = figure(3, figsize=(12.6, 3.2))
    plot_sweep(rows, ax=axes[0], title="default demo")
    fig.tight_layout()
    fig.savefig(out_dir / "loading.png", dpi=110)
    traced = lesson.trace_runs(dataset, step, sorted({0, best["workers"]}), pipeline.DEFAULT["batch_size"], out_dir,
                               active=3 if quick else 5, sync=pipeline.sync_fn())
    traces = lesson.trace_checks(traced, rows)
    fig, axes = figure(1, len(traced), figsize=(10, 2.2 * len(traced)), sharex=True)
    plot_traces({w: run["trace"] for w, run in traced.items()}, ax=axes[:, 0],
                titles={w: f"num_workers={w} (torch.profiler trace)" for w in traced})
    fig.savefig(out_dir / "loading_timeline.png", dpi=110)
    summary = (f"loading: busy {res['at_0']['busy']:.0%} at W=0, {best['busy']:.0%} at W={best['workers']} "
               f"({res['speedup']:.1f}x samples/s); checks: {checks.summary_line(lessons + traces)}")
    result = {"settings": {**pipeline.DEFAULT, "steps": steps, "rounds": rounds, "torch_threads": 1}, "fit": res["fit"],
              "fit_workers": list(res["fit_workers"]), "sweep": rows, "busy_at_0": res["at_0"]["busy"],
              "best_busy": best["busy"], "best_workers": best["workers"], "held_out_error": res["held_out_error"],
              "lesson": {"held": all(c.held for c in lessons), "alone_ms": 1e3 * alone, "others": load.others,
                         "cores": load.cores, "checks": [c.as_dict() for c in lessons]},
              "traces": {"files": [run["path"].name for run in traced.values()], "held": all(c.held for c in traces),
                         "checks": [c.as_dict() for c in traces], "active_steps": 3 if quick else 5}}
    return result, summary
