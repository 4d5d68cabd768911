"""Benchmarks behind docs/benchmarks/: `python -m kit.bench NAME [--quick | --tiny] [--out results/]`.

Each benchmark writes results/NAME.json (and its plots as results/NAME*.png) and prints, as its last line,
a one-line summary of the figures its issue asks for. Speed targets live here, never in unit tests.
`--tiny` is a smoke run of the benchmarks that offer one (seconds; the tests run it into a temporary folder).
"""
from __future__ import annotations

import argparse
import os
import inspect
import json
import platform
import sys
import time
from importlib import import_module
from pathlib import Path

from kit import sysinfo

# name -> "module:function"; each function takes (out_dir: Path, quick: bool[, tiny: bool]) and returns
# (result dict, summary). The function calls the experiments its notebook calls, with the benchmark's settings.
BENCHES = {name: f"kit.bench.{name}:bench" for name in
           ("loading", "ps", "allreduce", "mnist", "network", "gpu", "elastic", "mnist_lab", "ddp", "ddp_lab",
            "ring_cpu", "mp", "plan")}


_T0 = time.monotonic()


def say(message: str):
    """Print one progress line on stderr, `[  12.3 s] message` (seconds since the benchmark started): a long run
    shows where it is, and a run that stops moving shows where it stopped (stdout keeps the results)."""
    print(f"[{time.monotonic() - _T0:7.1f} s] {message}", file=sys.stderr, flush=True)


def machine() -> dict:
    """Return what the numbers were measured on."""
    return {"cpu_cores": sysinfo.cpu_cores(), "gpus": sysinfo.gpus(), "platform": platform.platform(),
            "versions": sysinfo.versions(), "date": time.strftime("%Y-%m-%d %H:%M:%S")}


def run(name: str, out_dir: Path, quick: bool = False, tiny: bool = False, mkdir: bool = True) -> str:
    """Run one benchmark, write out_dir/NAME.json, return its summary line (mkdir: make out_dir's missing
    parents too; else only out_dir itself, in a folder that exists)."""
    module, func = BENCHES[name].split(":")
    bench = getattr(import_module(module), func)
    if tiny and not has_tiny(name):
        raise ValueError(f"benchmark {name!r} has no --tiny setting: run it with --quick")
    out_dir.mkdir(parents=mkdir, exist_ok=True)
    say(f"{name}: {'tiny' if tiny else 'quick' if quick else 'full'} run")
    t0 = time.time()
    result, summary = bench(out_dir, quick, tiny=True) if tiny else bench(out_dir, quick)
    doc = {"benchmark": name, "quick": quick, "tiny": tiny, "seconds": round(time.time() - t0, 1), "machine": machine(),
           "summary": summary, **result}
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps(doc, indent=2, default=float) + "\n")
    print(f"wrote {path}")
    return summary


LAB = ("network", "elastic", "mnist_lab", "ddp_lab", "ring_cpu")   # build a kit.netlab lab: root only
GPU = ("gpu",)                                                      # need an NVIDIA GPU


def has_tiny(name: str) -> bool:
    """Whether benchmark `name` offers a --tiny setting."""
    module, func = BENCHES[name].split(":")
    return "tiny" in inspect.signature(getattr(import_module(module), func)).parameters


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kit.bench", description=__doc__.splitlines()[0],
                                epilog="`python -m kit.bench render` regenerates docs/benchmarks/*.md and the README's "
                                       "results lines from results/*.json (make docs)")
    p.add_argument("name", help=f"one of {', '.join(BENCHES)}; all (every benchmark this machine can run); render")
    p.add_argument("--quick", action="store_true", help="fewer repeats/sizes (a smoke run, not for the docs)")
    p.add_argument("--tiny", action="store_true", help="smallest settings: a smoke run (the benchmarks that have one)")
    p.add_argument("--out", type=Path, default=Path("results"), help="output folder (default: results/), in a "
                                                                      "folder that exists unless --mkdir")
    p.add_argument("--mkdir", action="store_true", help="make --out's missing parent folders")
    return p


def _check_args(p: argparse.ArgumentParser, a) -> None:
    """Refuse bad input with a clear error naming the argument, its value and what is allowed."""
    if a.name not in (*BENCHES, "all", "render"):
        p.error(f"argument name: {a.name!r} is not a benchmark; choose one of {', '.join(BENCHES)}, all or render")
    if a.quick and a.tiny:
        p.error("--quick and --tiny: give one of them (--tiny is the smaller)")
    if a.name in BENCHES and a.tiny and not has_tiny(a.name):
        with_tiny = ", ".join(n for n in BENCHES if has_tiny(n))
        p.error(f"--tiny: benchmark {a.name!r} has no tiny setting (those with one: {with_tiny}); run it with --quick")
    if a.out.exists() and not a.out.is_dir():
        p.error(f"--out: {str(a.out)!r} is a file, not a folder")
    if not a.out.parent.is_dir() and not a.mkdir:
        p.error(f"--out: {str(a.out)!r} is in {str(a.out.parent)!r}, which is not a folder: give --mkdir to make it")


def main(argv=None):
    p = _parser()
    a = p.parse_args(argv)
    _check_args(p, a)
    if a.name == "render":
        from kit.bench.render import main as render
        return render(Path.cwd())
    names = list(BENCHES) if a.name == "all" else [a.name]
    if a.name == "all":
        skip = {**{n: "needs root for kit.netlab: run it with sudo" for n in LAB if os.geteuid() != 0},
                **{n: "needs an NVIDIA GPU" for n in GPU if not sysinfo.gpus()},
                **{n: "no tiny setting" for n in BENCHES if a.tiny and not has_tiny(n)}}
        for name, why in skip.items():
            print(f"kit.bench: skipping {name!r} ({why})")
        names = [n for n in names if n not in skip]
    summaries = [run(n, a.out, a.quick, a.tiny, mkdir=a.mkdir) for n in names]
    for s in summaries:
        print(s)


from kit import _lazy_submodules  # noqa: E402

__getattr__, __dir__ = _lazy_submodules(__name__, __path__, globals())
