"""Notebook 01's sentences about its run, built from the run's numbers: the fitted model and the sweep's table
(section 4), the CPU pipeline against the cores' floor as kit.checks values (section 5), the summary (section 7);
appendix 01a's persistent workers (persistent_note), tf.data section (prefetch_note, prefetch_check,
parallel_note) and summary (knobs_summary).

    print(fit_line(fit)); print(sweep_table(rows, FIT_WORKERS))
    display(Markdown(said + " " + model_note(held_out, worst_row, real, pace, FIT_WORKERS, ROUNDS)))
    Markdown(cpu_note(f, kr, cap, floor) + "\\n\\n" + kit.checks.markdown(cpu_checks(gain, with_workers, floor, ...)))
"""
from __future__ import annotations

from kit.checks import Check
from kit.data.lesson import SPEEDUP      # the workers paid off at this many times W = 0's samples/s

FLOOR_TOL = 0.05     # the fastest step with workers may beat the cores' floor by this share (timing noise)
NAMES = {"t_compute_alone": "t_compute with loading in the loop (W=0)", "t_compute": "t_compute beside workers"}


def _ws(workers) -> str:
    return ", ".join(map(str, workers))


def fit_line(fit: dict) -> str:
    """Return the fitted model's times (ms) and core count as one line."""
    return (", ".join(f"{NAMES.get(k, k)} = {1e3 * v:.1f} ms" for k, v in fit.items() if k != "cores")
            + f", cores = {fit['cores']}")


def sweep_table(rows: list[dict], fitted) -> str:
    """Return the sweep's table: per W the samples/s (and their range over the rounds), busy, wait, step, the
    model's step and its error, the runs in `fitted` marked."""
    lines = [f"{'W':>3} {'samples/s':>10} {'per round':>11} {'busy':>6} {'wait ms':>8} {'step ms':>8} "
             f"{'model ms':>9} {'error':>6}"]
    for r in rows:
        seen = "  (fitted)" if r["workers"] in fitted else ""
        per_round = [s for s, _ in r["rounds"]]
        lines.append(f"{r['workers']:>3} {r['samples_per_s']:>10.0f} "
                     f"{f'{min(per_round):.0f}-{max(per_round):.0f}':>11} {r['busy']:>6.0%} {r['wait_ms']:>8.1f} "
                     f"{r['step_ms']:>8.1f} {r['predicted_ms']:>9.1f} {r['model_error']:>6.0%}{seen}")
    return "\n".join(lines)


def model_note(held_out: list[dict], worst_row: dict, real: list[int], pace: float, fitted, rounds: int) -> str:
    """Return what the fit predicted: the held-out W's worst error against the rounds' spread, and which held-out
    W tested t_load / W_eff (`real`) and which only echoed the fitted step time `pace` (s)."""
    worst, spread = worst_row["model_error"], worst_row["step_spread"]
    text = (f"Fitted to the W = {' and '.join(map(str, fitted))} runs, the model predicted the step time of "
            f"W = {_ws(r['workers'] for r in held_out)} within {worst:.0%} (worst case).")
    if rounds != 1:
        text += (f" That worst error is {'beyond' if worst > spread else 'within'} the spread of the step time over "
                 f"the rounds ({spread:.0%} at W = {worst_row['workers']})"
                 + (": more than run-to-run noise, a cost the model leaves out." if worst > spread else "."))
    text += (f" At W = {_ws(real)} the loader's side set the pace: a real prediction." if real else
             " At no held-out W did the loader's side set the pace, so none of them tests t_load / W_eff.")
    echo = [r["workers"] for r in held_out if r["workers"] not in real]
    if echo:
        text += (f" At W = {_ws(echo)} the step's side did, so the model gave the value it was fitted to at "
                 f"W = {fitted[1]} ({1e3 * pace:.1f} ms) by construction: that checks only that the step stayed "
                 f"as fast as there.")
    return text


def cpu_note(fit: dict, rows: list[dict], cap: float, floor_ms: float) -> str:
    """Return the CPU pipeline's share of loading at W = 0, the workers its cores can feed (`cap`), the floor
    (ms) that sets for a step with workers, and the model's error per W."""
    share = fit["t_load"] / (fit["t_load"] + fit["t_compute_alone"])
    errors = ", ".join(f"W={r['workers']}: {r['model_error']:.0%}" for r in rows)
    return (f"CPU pipeline, loading {share:.0%} of its step at W = 0. The cores can feed {cap:.1f} workers "
            f"(W_eff = min(W, {cap:.1f})), so with workers no step can be faster than "
            f"(t_load_cpu + c_compute) / cores = {floor_ms:.0f} ms. Per worker count the model's error was {errors}.")


def cpu_checks(gain: float, fastest: dict, floor_ms: float, cores: int, others: float,
               speedup: float = SPEEDUP, tol: float = FLOOR_TOL) -> list[Check]:
    """Return the CPU pipeline's two checks: the workers raised its samples/s `gain` times (at least `speedup`),
    and its fastest step with workers (`fastest`, a table row) was no more than `tol` below the cores' floor."""
    machine = f"other processes kept {others:.0%} of the {cores} cores busy meanwhile"
    paid = gain >= speedup
    workers = Check("workers on the CPU pipeline", measured=f"{gain:.1f}x its samples/s at W = 0" if paid else
                    f"{gain:.2f}x its samples/s at W = 0 at best", bound=f"at least {speedup}x", held=paid,
                    reason="" if paid else f"the decoders found no free core ({machine})",
                    detail="The workers overlapped decoding with the step until the cores were full "
                           f"({machine})" if paid else "Re-run on a quiet machine to see them help")
    beat = (fastest["step_ms"] - floor_ms) / floor_ms
    held = beat > -tol
    floor = Check("the cores' floor", measured=f"the fastest step with workers was {fastest['step_ms']:.0f} ms, at "
                                               f"W = {fastest['workers']}, {beat:+.0%} from that floor",
                  bound=f"no faster than {floor_ms:.0f} ms, less {tol:.0%} for noise", held=held,
                  reason="" if held else _floor_reason(fastest, floor_ms, cores, beat),
                  detail="A short run that counted the batches the workers queued while starting would beat the "
                         "floor without any such cause: `data.measure` skips them")
    return [workers, floor]


def _floor_reason(fastest: dict, floor_ms: float, cores: int, beat: float) -> str:
    """Why a step beat the cores' floor, from the CPU the run measured: the training process's and its workers'
    per step (table rows' cpu_ms, workers_cpu_ms) against the W = 0 run's (floor_ms x cores)."""
    w0 = floor_ms * cores
    if fastest.get("workers_cpu_ms") is None:
        return (f"the step was {-beat:.0%} faster than the CPU-seconds the W = 0 run measured per batch allow on "
                f"{cores} cores (this run did not measure the workers' CPU)")
    tree = fastest["cpu_ms"] + fastest["workers_cpu_ms"]
    return (f"at W = {fastest['workers']} the training process used {fastest['cpu_ms']:.0f} ms of CPU per step and "
            f"its workers {fastest['workers_cpu_ms']:.0f} ms, {tree:.0f} ms in all, against the {w0:.0f} ms the "
            f"W = 0 run measured with loading and step in one process: the same batch cost {1 - tree / w0:.0%} less "
            f"CPU this way, so a floor built on the W = 0 CPU-seconds is too high for it" if tree < w0 else
            f"at W = {fastest['workers']} the process and its workers used {tree:.0f} ms of CPU per step, no less "
            f"than the W = 0 run's {w0:.0f} ms, yet the step took {fastest['step_ms']:.0f} ms on {cores} cores: "
            "the CPU clocks and the step's clock disagree")


def summary(rows: list[dict], best: dict, speedup: float, worst: float, fitted, traces_held: bool, prof,
            measured: dict) -> str:
    """Return section 7's numbered list: busy at W = 0 and at the best W (`best`, a table row) with its
    `speedup`, the model's `worst` held-out error, the traces' verdict, and profile_loader's advice (`prof`)
    against its `measured` stats."""
    return (f"1. Busy at num_workers=0: {rows[0]['busy']:.0%}; the most samples/s at num_workers={best['workers']}: "
            f"{speedup:.1f}x of num_workers=0, busy {best['busy']:.0%}.\n"
            f"2. The model, fitted to W = {' and '.join(map(str, fitted))}, predicted the other worker counts "
            f"within {worst:.0%}.\n"
            f"3. The traces' data-wait share against the sweep's: {'held' if traces_held else 'did not hold'}.\n"
            f"4. `profile_loader` recommended num_workers={prof.recommended_workers}: predicted "
            f"{1e3 * prof.step_predicted:.0f} ms/step, measured {1e3 * measured['step']:.0f} ms/step "
            f"({measured['step'] / prof.step_predicted - 1:+.0%}).")


# --- appendix 01a, sections 1 and 3: one run per setting --------------------------------------------------------
NOISE = 0.10     # one run per setting on a shared machine: a smaller difference is no evidence


def prefetch_factor_note(stats: dict[str, dict]) -> str:
    """Return what `prefetch_factor` changed: {setting: a monitor's stats()} (samples_per_s and busy), the spread of
    the throughput against NOISE."""
    rate = {k: v["samples_per_s"] for k, v in stats.items()}
    lo, hi = min(rate, key=rate.get), max(rate, key=rate.get)
    spread = rate[hi] / rate[lo] - 1
    busy = [v["busy"] for v in stats.values()]
    return (f"From the slowest setting ({lo}, {rate[lo]:.0f} samples/s) to the fastest ({hi}, {rate[hi]:.0f}) the "
            f"throughput differs by {spread:.0%}; the step was busy {min(busy):.0%} to {max(busy):.0%} of the time. "
            + (f"Within {NOISE:.0%}, one run each: no evidence that the queue's depth matters here."
               + (" The step was busy nearly all the time whatever the depth: loading kept up on average, so a "
                  "deeper queue had nothing to hide; it only absorbs jitter." if min(busy) >= 0.9 else "")
               if spread <= NOISE else
               f"More than {NOISE:.0%}, but one run each on a shared machine: run the cell again before reading an "
               "order into it. A deeper queue can only help when loading is uneven (slow reads, big images); "
               "in steady state it holds more batches in memory and hides nothing more."))


# --- appendix 01a, section 1: persistent_workers -----------------------------------------------------------------
LITTLE = 0.02    # a saving below this share of an epoch is little


def persistent_note(later: dict, saved: float, steps: int, epoch: float) -> str:
    """Return what persistent workers saved: the first batch's wait (s) from epoch 2 on (`later`, keyed by
    persistent_workers), the `saved` difference, and its share of one epoch of `steps` steps taking `epoch` s."""
    verdict = ("little here, because these workers are small processes that import nothing heavy; it grows with "
               "each worker's start-up (heavy imports, a big dataset object to send) and with shorter epochs."
               if saved / epoch < LITTLE else
               "worth having even here; it grows with each worker's start-up (heavy imports, a big dataset object) "
               "and with shorter epochs.")
    return ("The first batch of an epoch still costs a batch's loading: the workers start on it when the epoch "
            "starts. What persistent workers save is starting the processes again: from the second epoch on, the "
            f"first batch waited {1e3 * later[True]:.0f} ms with persistent workers against "
            f"{1e3 * later[False]:.0f} ms with new ones, {1e3 * saved:.0f} ms ({saved / later[False]:.0%} of that "
            f"wait) once per epoch. Against one epoch of this data set ({steps} steps, about {epoch:.1f} s) that "
            f"is {saved / epoch:.1%} of the epoch: " + verdict)


# --- appendix 01a, section 3: tf.data's buffers and parallel calls -----------------------------------------------


def prefetch_check(serial: dict, buffered: list[dict], ahead: dict, batch: int) -> Check:
    """Whether a prefetch buffer on the serial map stayed within what overlapping alone allows: one batch per
    max(the loader's own time per batch, the step's compute), `ahead` being run_ahead's measure of the serial map."""
    L, C = ahead["load_ms"], serial["compute_ms"]
    pace = 1e3 * batch / max(L, C)
    best = max(buffered, key=lambda r: r["samples_per_s"])
    return Check("a buffer on the serial map", measured=f"{best['samples_per_s']:.0f} samples/s with "
                                                         f"{best['workers']}",
                 bound=f"at most one batch per max(L = {L:.0f} ms, the map loading alone; C = {C:.0f} ms, the "
                       f"step): {pace:.0f} samples/s (+{NOISE:.0%})",
                 held=best["samples_per_s"] <= pace * (1 + NOISE),
                 reason=f"it beat the pace of the loader timed alone: the map ran faster during the sweep than "
                        f"when timed after it ({L:.0f} ms a batch)")


def prefetch_note(serial: dict, pre: dict, four: dict, ahead: dict, ahead_pre: dict, batch: int) -> str:
    """Return what prefetch did on the serial map and why, from the sweep's rows and run_ahead's measures of the
    map without (`ahead`) and with (`ahead_pre`) a buffer."""
    L, C, away = ahead["load_ms"], serial["compute_ms"], ahead["away_ms"]
    gain = pre["samples_per_s"] / serial["samples_per_s"] - 1
    already = ahead["after_away_ms"] < 0.7 * L
    return (f"**Prefetch alone**: the wait per step went from {serial['wait_ms']:.1f} to {pre['wait_ms']:.1f} ms "
            f"(a buffer of 4 batches: {four['wait_ms']:.1f} ms), the throughput {gain:+.0%} "
            f"({pre['samples_per_s']:.0f} against {serial['samples_per_s']:.0f} samples/s). Why: timed alone, the "
            f"serial map loads a batch in L = {L:.0f} ms; the step computes C = {C:.0f} ms. After the consumer had "
            f"been away {away:.0f} ms, as during a step, `next()` waited {ahead['after_away_ms']:.0f} ms without "
            f"prefetch and {ahead_pre['after_away_ms']:.0f} ms with it"
            + (": even without a prefetch buffer, tf.data's iterator had loaded the next batch while the consumer "
               "was away, so the baseline was already overlapped and a buffer had nothing to add. " if already else
               ": without a buffer nothing was loaded while the consumer was away. ")
            + (f"And a loader slower than the step sets the pace: one batch per {L:.0f} ms at best whatever the "
               "buffer's size; only more parallel calls make the map itself faster. " if L > C else
               "The loader kept up with the step, so a buffer can hide its time entirely. "))


def parallel_note(auto: dict, eight: dict, serial: dict) -> str:
    """Return what the parallel maps did: their wait against the serial map's, and map(8) against AUTOTUNE."""
    gain = eight["samples_per_s"] / auto["samples_per_s"] - 1
    cut = auto["wait_ms"] < 0.7 * serial["wait_ms"]
    return ("The parallel maps load several samples at once" + (" and cut the wait further. " if cut else
                                                                ", and did not cut the wait either on this run. ")
            + f"**`map(8)` against `AUTOTUNE`**: {eight['samples_per_s']:.0f} against {auto['samples_per_s']:.0f} "
              f"samples/s ({gain:+.0%}). "
            + ("Here the explicit larger `num_parallel_calls` went further, as W did for the DataLoader: AUTOTUNE "
               "sizes the parallelism from the cores it sees, and a latency-bound map can use more calls than cores."
               + ("" if gain > 2 * NOISE else f" One run each, and {gain:+.0%} is close to the {NOISE:.0%} this "
                  "appendix counts as noise: run the cell again before relying on it.")
               if gain > NOISE else
               f"Within {NOISE:.0%}, one run each: no evidence that a larger explicit `num_parallel_calls` goes "
               "further here; AUTOTUNE had found enough parallel calls for this map." if gain > -NOISE else
               "AUTOTUNE did better than the fixed 8 calls here: more calls than the machine can serve only add "
               "contention."))


# --- appendix 01a, summary -----------------------------------------------------------------------------------------
def knobs_summary(pf: dict, workers: int, k_best: dict, k_loop: dict, t_best: dict, t_plain: dict) -> str:
    """Return the appendix's numbered list: samples/s per prefetch_factor (`pf`) with `workers` workers, the best
    Keras row against loading in the loop (`k_loop`), the best tf.data row against the plain map (`t_plain`)."""
    return (f"1. `prefetch_factor` 1, 2, 4 with {workers} workers: " + ", ".join(f"{v:.0f}" for v in pf.values())
            + " samples/s.\n"
            f"2. Keras `PyDataset`: best {k_best['samples_per_s']:.0f} samples/s with {k_best['workers']}, against "
            f"{k_loop['samples_per_s']:.0f} loading in the loop.\n"
            f"3. tf.data: best {t_best['samples_per_s']:.0f} samples/s with {t_best['workers']}, against "
            f"{t_plain['samples_per_s']:.0f} without parallel map or prefetch.")
