"""Notebook 05's checks on the engines (sections 1–7), each a kit.checks.Check of numbers from a run of
kit.ddp.schemes.experiment or from the notebook's own cells, and the numbers of the bucket sweep as table rows.
What each lesson claims and why it should hold is the notebook's Markdown; kit.checks.show renders the checks.

    kit.checks.show(all_checks(x))          # correctness, the bucket sweep, the α–β model, overlap, fp16, memory
    print(kit.ddp.md(sweep_rows(x)))        # per bucket size: allreduces, median step, its range, the model
"""
from __future__ import annotations

from kit.checks import Check
from kit.ddp.memory import memory_checks
from kit.ddp.schemes import by_scheme, first

MODEL_FACTOR = 2.0       # the α–β model explains the bucket sweep when measured/model saving is within 2× either way
TOL = 1e-5               # float32: a scheme's weights equal one process's within this
WIN = 0.75               # fewer messages beat more in at least this share of the pairs of timed steps


def weights_check(name: str, err: list[float], tol: float = TOL) -> Check:
    """The largest |w − w_ref| over the ranks (`err`: one per rank) against one process on the N× batch."""
    return Check(f"{name}: max abs(Δw) over ranks", max(err), f"< {tol:.0e}", max(err) < tol)


def zero_step_checks(zero_err: list[float], shards: list[int], numel: int, tol: float = TOL) -> list[Check]:
    """Section 6's ZeRO step: one process's weights, and momentum for ⌈K/N⌉ of the K parameters on every rank
    (`shards`: per rank, the momentum's elements; the row shows the rank farthest from ⌈K/N⌉)."""
    want = -(-numel // len(shards))
    worst = max(shards, key=lambda s: abs(s - want))
    return [weights_check("ZeRO step", zero_err, tol), Check("ZeRO step: momentum elements per rank", worst, want,
                                                              worst == want)]


def fsdp_shard_checks(local: list[list[tuple]], full: list[tuple]) -> list[Check]:
    """Section 7: per rank, the elements of its shards against FSDP2's rule, dim 0 cut in N pieces of ⌈d₀/N⌉ rows
    (torch.chunk; the last ranks get fewer or none). `local`: per rank the local shapes; `full`: the global ones."""
    N, out = len(local), []
    for r, shapes in enumerate(local):
        want = 0
        for shape in full:
            rows, rest = -(-shape[0] // N), _numel(shape[1:])
            want += max(0, min(rows, shape[0] - r * rows)) * rest
        have = sum(_numel(s) for s in shapes)
        out.append(Check(f"FSDP2: parameters on rank {r}", have, want, have == want))
    return out


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def bucket_extremes(x: dict) -> tuple[dict, dict]:
    """Return the bucket rows with the most and the fewest allreduces per step. Where bucket sizes tie on the count,
    the comparison takes the side against the lesson: the fastest of the most-messages rows and the slowest of the
    fewest."""
    rows = [r for r in x["rows"] if r["scheme"].startswith("buckets:")]
    most, fewest = max(r["calls"] for r in rows), min(r["calls"] for r in rows)
    return (min((r for r in rows if r["calls"] == most), key=lambda r: r["step_ms"]),
            max((r for r in rows if r["calls"] == fewest), key=lambda r: r["step_ms"]))


def noise_ms(x: dict) -> float:
    """The widest gap between the medians of bucket sizes that made the same number of allreduces (the same bytes
    in as many messages): this run's noise for a saving between counts; 0.0 where every count is made once."""
    same = {}
    for r in x["rows"]:
        if r["scheme"].startswith("buckets:"):
            same.setdefault(r["calls"], []).append(r["step_ms"])
    return max((max(g) - min(g) for g in same.values() if len(g) > 1), default=0.0)


def win_rate(fast: list[float], slow: list[float]) -> float:
    """The share of pairs (a step of `fast`, a step of `slow`) in which the first was the shorter (ties count half)."""
    pairs = [(a < b) + 0.5 * (a == b) for a in fast for b in slow]
    return sum(pairs) / len(pairs)


def sweep_rows(x: dict) -> list[dict]:
    """Per bucket size, most allreduces first: the allreduces per step, the median step, the fastest and slowest
    timed step, and the α–β model's time of the step's allreduces (where α and B were measured)."""
    rows = sorted((r for r in x["rows"] if r["scheme"].startswith("buckets:")), key=lambda r: -r["calls"])
    return [{"bucket": r["label"], "allreduces": r["calls"], "median ms": r["step_ms"],
             "fastest": r["step_ms_range"][0], "slowest": r["step_ms_range"][1],
             "model ms": r.get("model_comm_ms", "–")} for r in rows]


def alpha_rows(x: dict) -> list[dict]:
    """The α–β model's inputs on this run: B (ping-pong), α as an allreduce pays it (an allreduce of one float over
    its 2(N−1) messages: median and range of its calls), and the ping-pong's own α."""
    ar = x.get("allreduce_1float") or {"seconds": float("nan"), "range": [float("nan")] * 2, "repeats": 0}
    return [{"B GB/s": x["B_bytes_per_s"] / 1e9, "α µs": x["alpha_s"] * 1e6,
             "1-float allreduce µs": ar["seconds"] * 1e6, "fastest": ar["range"][0] * 1e6,
             "slowest": ar["range"][1] * 1e6, "calls": ar["repeats"],
             "ping-pong α µs": (x.get("alpha_pingpong_s") or float("nan")) * 1e6}]


def correct_check(x: dict) -> Check:
    """Every communicating scheme ended with one process's weights on the N× batch (within its tolerance)."""
    rows = [r for r in x["rows"] if r["ok"] is not None]
    ok = sum(bool(r["ok"]) for r in rows)
    return Check("schemes with one process's weights", ok, len(rows), ok == len(rows))


def buckets_checks(x: dict) -> list[Check]:
    """Fewer, larger messages make the step faster: the bucket size with the fewest allreduces saves time on the
    most, by more than twice this run's noise (noise_ms), and wins at least WIN of the pairs of timed steps."""
    many, few = bucket_extremes(x)
    saved, noise = many["step_ms"] - few["step_ms"], noise_ms(x)
    win = win_rate(few["steps_ms"], many["steps_ms"])
    name = f"{many['calls']} → {few['calls']} allreduces"
    return [Check(f"{name}: step saved", saved, f"≥ {2 * noise:.1f} ms" if noise else "> 0 ms",
                  saved > 0 and saved >= 2 * noise, unit=" ms"),
            Check(f"{name}: pairs of steps won", win, f"≥ {WIN:.2f}", win >= WIN)]


def model_check(x: dict) -> Check:
    """The α–β model explains the bucket sweep: the measured saving within MODEL_FACTOR of the model's, with α as
    an allreduce pays it on these engines and the ping-pong's B."""
    many, few = bucket_extremes(x)
    saved, model_saved = many["step_ms"] - few["step_ms"], many["model_comm_ms"] - few["model_comm_ms"]
    ratio = saved / model_saved if model_saved > 0 else float("nan")
    return Check("α–β model: saving measured / model", ratio, f"{1 / MODEL_FACTOR:.2f}–{MODEL_FACTOR:.2f}",
                 model_saved > 0 and 1 / MODEL_FACTOR <= ratio <= MODEL_FACTOR)


def overlap_check(x: dict) -> Check:
    """Overlapping the allreduces with backward makes the step faster than the naive hooks."""
    s = by_scheme(x)
    ratio = s["overlap"]["step_ms"] / s["naive"]["step_ms"]
    return Check("overlap on loopback: overlapped / naive step", ratio, "< 1", ratio < 1)


def fp16_check(x: dict) -> Check:
    """DDP's fp16 compress hook hands half the bytes to its allreduces."""
    ratio = first(x, "ddp_fp16")["handed"] / first(x, "ddp")["handed"]
    return Check("fp16 hook: bytes handed / DDP's", ratio, "0.50 ± 0.01", abs(ratio - 0.5) <= 0.01)


def sweep_checks(x: dict) -> list[Check]:
    """Section 4's lessons: buckets, the α–β model (where α and B were measured), overlap."""
    has_model = all("model_comm_ms" in r for r in bucket_extremes(x))
    return [*buckets_checks(x), *([model_check(x)] if has_model else []), overlap_check(x)]


def all_checks(x: dict) -> list[Check]:
    """Every lesson of sections 4–7 on one run: correctness, the sweep, fp16, memory at its peak."""
    return [correct_check(x), *sweep_checks(x), fp16_check(x), *memory_checks(x)]
