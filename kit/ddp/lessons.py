"""Notebook 05's lessons on the engines (sections 4–7), each checked on a run of kit.ddp.schemes.experiment as a
kit.checks.Check; notebook 05 and `python -m kit.bench ddp` render them with kit.checks.

    display(Markdown(kit.checks.markdown(sweep_checks(x, os.cpu_count()))))   # buckets, the α–β model, overlap

Section 2's note on the allreduces still running when backward() returned (in_flight_note), and its check that
finish() before the step gives one process's weights (finish_check), and section 6's check of the learner's ZeRO
step (zero_step_check), are here too.
"""
from __future__ import annotations

from kit.checks import Check
from kit.ddp.memory import memory_checks
from kit.ddp.schemes import by_scheme, first

MODEL_FACTOR = 2.0       # the α–β model explains the bucket sweep when measured/model saving is within 2× either way
TOL = 1e-5               # float32: the overlapped hooks' weights equal one process's within this
WIN = 0.75               # fewer messages beat more in at least this share of the pairs of timed steps (buckets_check)


def in_flight_note(in_flight: list[list[tuple[int, int]]], unfinished: int) -> str:
    """Return section 2's note: per rank and step, the allreduces completed of those launched when backward()
    returned, and what the `unfinished` ones (still running then) mean for a step taken at that moment."""
    steps = "; ".join(f"rank {r}: " + ", ".join(f"{d} of {n}" for d, n in per_step)
                      for r, per_step in enumerate(in_flight))
    return (f"Completed allreduces when `backward()` returned, per step ({steps}). "
            + (f"In all, {unfinished} allreduces were still running at that moment: stepping then would have used "
               "unfinished sums." if unfinished else
               "On this run every allreduce had already finished by then (the last ones are small and the machine "
               "was quick), but nothing guarantees it: the next run, or a bigger model, can differ."))


def finish_check(overlap_err: list[float], tol: float = TOL) -> Check:
    """With finish() before the step, every rank's weights equal one process's on the N× batch (within `tol`)."""
    held = all(e < tol for e in overlap_err)
    return Check("finish() before the step", measured=f"every rank's weights within {max(overlap_err):.1e} of one "
                 "process trained on the N× batch", bound=f"{tol:.0e}", held=held, reason="" if held else
                 "the largest differences per rank were " + ", ".join(f"{e:.1e}" for e in overlap_err))


def zero_step_check(zero_err: list[float], shards: list[int], numel: int, tol: float = TOL) -> Check:
    """Section 6's ZeRO step, the notebook's own cell: every rank's weights equal one process's on the N× batch
    (within `tol`), and each rank kept momentum for its shard only, ceil(K/N) of the K parameters (`shards`: per
    rank, the momentum's elements)."""
    world = len(shards)
    want = -(-numel // world)
    bad = [f"rank {r}'s weights differ by {e:.1e}" for r, e in enumerate(zero_err) if not e < tol]
    bad += [f"rank {r} kept momentum for {s:,} elements, not {want:,}" for r, s in enumerate(shards) if s != want]
    return Check("the ZeRO step", measured=f"every rank's weights within {max(zero_err):.1e} of one process trained "
                 f"on the N× batch; momentum per rank: {', '.join(f'{s:,}' for s in shards)} of {numel:,} elements",
                 bound=f"{tol:.0e}, and ⌈K/N⌉ = {want:,} elements", held=not bad, reason="; ".join(bad))


def bucket_extremes(x: dict) -> tuple[dict, dict]:
    """Return the bucket rows with the most and the fewest allreduces per step. Where bucket sizes tie on the count
    (16 KB and 256 KB buckets can both make 5), the comparison takes the side against the lesson: the fastest of
    the most-messages rows and the slowest of the fewest."""
    rows = [r for r in x["rows"] if r["scheme"].startswith("buckets:")]
    most, fewest = max(r["calls"] for r in rows), min(r["calls"] for r in rows)
    return (min((r for r in rows if r["calls"] == most), key=lambda r: r["step_ms"]),
            max((r for r in rows if r["calls"] == fewest), key=lambda r: r["step_ms"]))


def _by_count(x: dict) -> dict[int, list[dict]]:
    """The bucket rows grouped by how many allreduces a step made: {calls: [row, ...]}."""
    same = {}
    for r in x["rows"]:
        if r["scheme"].startswith("buckets:"):
            same.setdefault(r["calls"], []).append(r)
    return same


def noise_ms(x: dict) -> float:
    """The widest gap between the medians of bucket sizes that made the same number of allreduces (the same bytes
    in as many messages): this run's noise for a saving between counts; 0.0 where every count is made once."""
    gaps = [max(r["step_ms"] for r in g) - min(r["step_ms"] for r in g) for g in _by_count(x).values() if len(g) > 1]
    return max(gaps, default=0.0)


def twins(x: dict) -> str:
    """Return the sentence on bucket sizes that made the same number of allreduces (the same bytes in as many
    messages, so their difference is the run's noise), or "" where every count is made once."""
    same = _by_count(x)
    ends = {max(same), min(same)}
    parts = [f"{' and '.join(r['label'] for r in g)} {'both' if len(g) == 2 else 'all'} made {c} allreduces, yet "
             f"their medians were {max(r['step_ms'] for r in g) - min(r['step_ms'] for r in g):.1f} ms apart"
             for c, g in sorted(same.items(), reverse=True) if len(g) > 1]
    if not parts:
        return ""
    checked = any(len(g) > 1 and c in ends for c, g in same.items())
    return ("; ".join(parts) + ": that much is this run's noise between the same bytes in as many messages"
            + (", so the check compares the fastest of the most-messages settings with the slowest of the fewest"
               if checked else ""))


def correct_check(x: dict) -> Check:
    """Every scheme ended with one process's weights on the N× batch (within its tolerance)."""
    rows = [r for r in x["rows"] if r["ok"] is not None]
    worst = max(rows, key=lambda r: r["err"])
    wrong = [r["label"] for r in rows if not r["ok"]]
    return Check("correct", measured=f"largest max |w − w_ref| {worst['err']:.1e} ({worst['label']})",
                 bound="1e-5 for float32 schemes, 1e-3 with the fp16 hook", held=not wrong,
                 reason=f"{', '.join(wrong)} did not end with one process's weights" if wrong else "",
                 detail=f"Every one of the {len(rows)} communicating schemes was compared with one process trained "
                 "on the N× batch")


def win_rate(fast: list[float], slow: list[float]) -> float:
    """The share of pairs (a step of `fast`, a step of `slow`) in which the first was the shorter (ties count half)."""
    pairs = [(a < b) + 0.5 * (a == b) for a in fast for b in slow]
    return sum(pairs) / len(pairs)


def buckets_check(x: dict) -> Check:
    """Fewer, larger messages make the step faster: the bucket size with the fewest allreduces beats the most, by
    its median step and in at least WIN of the pairs of timed steps (a difference inside the steps' spread does not
    hold); every bucket size's median and fastest–slowest step are shown."""
    many, few = bucket_extremes(x)
    spread = lambda r: f"{r['step_ms']:.1f} ms ({r['step_ms_range'][0]:.1f}–{r['step_ms_range'][1]:.1f})"  # noqa: E731
    rows = sorted((r for r in x["rows"] if r["scheme"].startswith("buckets:")), key=lambda r: -r["calls"])
    win, noise, saved = win_rate(few["steps_ms"], many["steps_ms"]), noise_ms(x), many["step_ms"] - few["step_ms"]
    held = saved > 0 and win >= WIN and saved >= 2 * noise
    if few["step_ms"] >= many["step_ms"]:
        reason = f"{few['label']} took {few['step_ms']:.1f} ms against {many['label']}'s {many['step_ms']:.1f}"
    elif win < WIN:
        reason = (f"{few['label']}'s step was the shorter in only {win:.0%} of the pairs of timed steps: the "
                  f"{many['step_ms'] - few['step_ms']:.1f} ms between the medians is inside this run's step-to-step "
                  "spread")
    else:
        reason = (f"the {saved:.1f} ms saved is under twice the {noise:.1f} ms between settings with the same count "
                  "(this run's noise): this run alone does not separate the counts")
    detail = ("Median step (fastest–slowest of the timed steps) per bucket size: "
              + "; ".join(f"{r['label']}, {r['calls']} allreduce{'s' * (r['calls'] != 1)}: {spread(r)}" for r in rows)
              + f". Compute alone: {by_scheme(x)['local']['step_ms']:.1f} ms"
              + (f". {twins(x)[0].upper()}{twins(x)[1:]}" if twins(x) else ""))
    return Check("buckets", measured=f"{many['calls']} → {few['calls']} allreduces per step: {spread(many)} → "
                 f"{spread(few)}; the fewer-messages step the shorter in {win:.0%} of the pairs of timed steps",
                 bound=f"a shorter median step, in at least {WIN:.0%} of the pairs" + (
                     ", and a saving at least twice the gap between settings with the same count" if noise else ""),
                 held=held,
                 reason="" if held else reason, detail=detail)


def model_check(x: dict, cores: int) -> Check:
    """The α–β model explains the bucket sweep: the measured saving within MODEL_FACTOR of the model's, with α as
    an allreduce pays it on these engines (x["allreduce_1float"]) and the ping-pong's B."""
    many, few = bucket_extremes(x)
    saved, model_saved = many["step_ms"] - few["step_ms"], many["model_comm_ms"] - few["model_comm_ms"]
    ratio = saved / model_saved if model_saved > 0 else float("nan")
    noise, in_band = noise_ms(x), model_saved > 0 and 1 / MODEL_FACTOR <= ratio <= MODEL_FACTOR
    held = in_band and saved >= 2 * noise
    reason = (f"the measured saving ({saved:.1f} ms) is under twice this run's noise ({noise:.1f} ms between settings "
              "with the same count), so it cannot test the model" if in_band else
              _model_reason(x, saved, model_saved, cores))
    return Check("α–β model", measured=f"measured saving {saved:.1f} ms = {ratio:.2f}× the model's {model_saved:.1f} "
                 "ms", held=held, bound=f"within {MODEL_FACTOR:g}× either way" + (
                     ", with a saving above twice the noise" if noise else ""),
                 reason="" if held else reason, detail=_model_detail(x, many, few))


def alpha_words(x: dict) -> str:
    """Return where the model's α came from: an allreduce of one float on these engines (and the ping-pong's α)."""
    ar, pp = x.get("allreduce_1float"), x.get("alpha_pingpong_s")
    if not ar:
        return f"α = {x['alpha_s'] * 1e6:.0f} µs (ping-pong on this job)"
    lo, hi = ar["range"]
    return (f"α = {x['alpha_s'] * 1e6:.0f} µs as an allreduce pays it here (one float among the {x['N']} engines took "
            f"{ar['seconds'] * 1e6:.0f} µs, median of {ar['repeats']} calls, {lo * 1e6:.0f}–{hi * 1e6:.0f}, over "
            f"its 2(N−1) = {2 * (x['N'] - 1)} messages in sequence" +
            (f"; the ping-pong between two engines gave {pp * 1e6:.0f} µs)" if pp else ")"))


def _model_detail(x: dict, many: dict, few: dict) -> str:
    """Return the model's sentence: its α and B, and the allreduces' time with many and with few buckets."""
    return (f"With B = {x['B_bytes_per_s'] / 1e9:.2f} GB/s (ping-pong) and {alpha_words(x)}, the model puts a "
            f"step's allreduces at {many['model_comm_ms']:.1f} ms with {many['calls']} messages and "
            f"{few['model_comm_ms']:.1f} ms with {few['calls']}: {many['calls'] - few['calls']} fewer messages × "
            "2(N−1)·α (the bytes are the same)")


def _model_reason(x: dict, saved: float, model_saved: float, cores: int) -> str:
    """Return why the saving was not the model's, from the run: bigger (each call paid more during backward than
    on idle engines) or smaller (hidden behind backward, and the step times vary)."""
    many, few = bucket_extremes(x)
    fewer = max(1, many["calls"] - few["calls"])
    if saved > model_saved:
        return (f"each allreduce fewer saved {saved / fewer:.1f} ms, more than the {model_saved / fewer:.2f} ms one "
                f"costs on idle engines: during backward {x['N']} processes and Gloo's threads share {cores} cores, "
                "so each call also waits for a core")
    return (f"the step saved less than the model's {model_saved:.1f} ms: a bucket's allreduce runs beside backward, "
            "so part of what it costs is hidden either way, and the step times vary from step to step")


def overlap_check(x: dict, cores: int) -> Check:
    """Overlapping the allreduces with backward makes the step faster than the naive hooks."""
    s = by_scheme(x)
    naive, over = s["naive"]["step_ms"], s["overlap"]["step_ms"]
    held = over < naive
    return Check("overlap on loopback", measured=f"naive {naive:.1f} ms, overlapped {over:.1f} ms per step",
                 bound="overlapped < naive", held=held, reason="" if held else
                 f"{x['N']} engines on {cores} cores: no core is free for Gloo's thread beside backward",
                 detail=f"Overlap saved {naive - over:.1f} ms" if held else "")


def fp16_check(x: dict) -> Check:
    """DDP's fp16 compress hook hands half the bytes to its allreduces."""
    ddp, fp16 = first(x, "ddp"), first(x, "ddp_fp16")
    ratio = fp16["handed"] / ddp["handed"]
    held = abs(ratio - 0.5) <= 0.01
    return Check("fp16 bytes", measured=f"the hook handed {ratio:.2f}× DDP's bytes", bound="0.50 ± 0.01", held=held,
                 reason="" if held else f"{fp16['handed']:,} bytes against DDP's {ddp['handed']:,}",
                 detail=f"Step {ddp['step_ms']:.1f} ms without the hook, {fp16['step_ms']:.1f} ms with it; its "
                 f"weights within {fp16['err']:.1e} of one process (without: {ddp['err']:.1e})")


def sweep_checks(x: dict, cores: int) -> list[Check]:
    """Section 4's lessons: buckets, the α–β model, overlap."""
    has_model = all("model_comm_ms" in r for r in bucket_extremes(x))        # α and B measured on this run
    return [buckets_check(x), *([model_check(x, cores)] if has_model else []), overlap_check(x, cores)]


def all_checks(x: dict, cores: int) -> list[Check]:
    """Every lesson of sections 4–7 on one run: correctness, the sweep, fp16, memory at its peak."""
    return [correct_check(x), *sweep_checks(x, cores), fp16_check(x), *memory_checks(x)]
