"""A lesson checked on a run, as a value; one renderer for the notebooks' Markdown and the benchmarks' summary lines.

    c = Check("fp16", measured="0.502× DDP's bytes on each NIC", bound="0.500 ± 0.015", held=abs(r - 0.5) <= 0.015,
              reason="each NIC sent 0.55× DDP's bytes", detail="each NIC sent 1,234 bytes per step with the hook, ...")
    display(Markdown(markdown([c, ...])))      # - **fp16** held: 0.502× DDP's bytes on each NIC (bound: ...). ...
    summary_line([c, ...])                     # "checks: fp16 held; bytes did not hold because ..."

A check that did not hold says so and why: "**did not hold** on this run: MEASURED (bound: BOUND), because REASON".
"""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Check:
    """One lesson on one run: what was measured, the bound or rule it must meet, whether it held, and why not."""
    name: str
    measured: str           # the measured value, as a phrase with its number(s)
    bound: str              # the bound or the rule, as a phrase
    held: bool
    reason: str = ""        # when it did not hold: why, from the run's numbers (one line)
    detail: str = ""        # the sentence the notebook shows after the verdict (the run's numbers)

    def __post_init__(self):
        if not self.held and not self.reason:
            raise ValueError(f"check {self.name!r} did not hold: give its reason")

    def as_dict(self) -> dict:
        """Return the check as results/*.json stores it."""
        return asdict(self)


def from_dict(d: dict) -> Check:
    """Return the Check that as_dict() stored."""
    return Check(**d)


def verdict(c: Check) -> str:
    """Return one check's verdict as a sentence: held, or did not hold … because …."""
    if c.held:
        return f"held: {c.measured} (bound: {c.bound})"
    return f"**did not hold** on this run: {c.measured} (bound: {c.bound}), because {c.reason}"


def markdown(checks: list[Check], details: bool = True) -> str:
    """Return the notebook's Markdown: one bullet per check, its verdict, then (with `details`) its detail."""
    lines = []
    for c in checks:
        detail = f" {c.detail}." if c.detail and details else ""
        lines.append(f"- **{c.name}** {verdict(c)}.{detail}")
    return "\n".join(lines)


def summary_line(checks: list[Check]) -> str:
    """Return the benchmark's summary words: the checks that held by name, each failing one with its reason."""
    held = [c.name for c in checks if c.held]
    failed = [f"{c.name} did not hold because {c.reason}" for c in checks if not c.held]
    return "; ".join(([f"held: {', '.join(held)}"] if held else []) + failed)
