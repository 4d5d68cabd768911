"""A lesson checked on a run, as data; one table renders a list of them.

    c = Check("fp16 halves the bytes", measured=0.502, bound="0.500 ± 0.015", held=abs(r - 0.5) <= 0.015,
              unit="× DDP's bytes")
    kit.checks.show([c, ...])      # in a notebook: one table, a row per check (check · measured · predicted · held)
    table([c, ...])                # the same table as Markdown text
    summary_line([c, ...])         # a benchmark's last line: "checks: 3/4 held; missed: bytes"

The lesson's claim, why it should hold and the known reasons a run can miss are static Markdown in the notebook
beside the table; a check carries numbers, not sentences. `reason` and `detail` remain for older callers and
results files; the table does not show them.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Check:
    """One lesson on one run: what was measured, the bound or rule it must meet, whether it held, and why not."""
    name: str               # what was checked, a short label
    measured: object        # the measured value: a number (formatted with `unit`) or a short value
    bound: object           # what the model or bound predicts: a number, or a range such as "≤ 1.05"
    held: bool
    reason: str = ""        # older callers: why it did not hold (not rendered by `table`)
    detail: str = ""        # older callers: the run's numbers as a phrase (not rendered by `table`)
    unit: str = ""          # the unit of `measured` (and of `bound` when it is a number)

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a check needs a name (a non-empty str), got {self.name!r}")
        if type(self.held).__name__ not in ("bool", "bool_"):       # numpy's comparisons give numpy.bool_
            raise TypeError(f"check {self.name!r}: held must be a bool, got {type(self.held).__name__}")
        object.__setattr__(self, "held", bool(self.held))

    def as_dict(self) -> dict:
        """Return the check as results/*.json stores it."""
        return asdict(self)


def from_dict(d: dict) -> Check:
    """Return the Check that as_dict() stored."""
    return Check(**d)


def fmt(x: object, unit: str = "") -> str:
    """Return a measured or predicted value as the table shows it: 3 significant figures, thousands separated."""
    if isinstance(x, bool) or x is None:
        text = str(x)
    elif isinstance(x, int):
        text = f"{x:,}"
    elif isinstance(x, float):
        if x != x:
            text = "nan"
        elif x == 0:
            text = "0"
        elif 1e-3 <= abs(x) < 1e6:
            text = f"{x:,.{max(0, 2 - math.floor(math.log10(abs(x))))}f}"
        else:
            text = f"{x:.3g}"
    else:
        text = str(x)
    return f"{text}{unit}" if unit and not isinstance(x, str) else text


def table(checks: list[Check]) -> str:
    """Return the checks as one Markdown table: check · measured · predicted or bound · held."""
    if not checks:
        raise ValueError("table() needs at least one Check")
    rows = ["| check | measured | predicted or bound | held |", "|---|---|---|---|"]
    for c in checks:
        held = "yes" if c.held else "**no**"
        rows.append(f"| {c.name} | {fmt(c.measured, c.unit)} | {fmt(c.bound, c.unit)} | {held} |")
    return "\n".join(rows)


def show(checks: list[Check]) -> None:
    """Display the checks' table in a notebook (the one renderer of a run's evidence)."""
    from IPython.display import Markdown, display
    display(Markdown(table(checks)))


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
    """Return the benchmark's summary words: the checks that held by name, each failing one (with its reason, if
    an older caller gave one)."""
    held = [c.name for c in checks if c.held]
    failed = [f"{c.name} did not hold" + (f" because {c.reason}" if c.reason else "") for c in checks if not c.held]
    return "; ".join(([f"held: {', '.join(held)}"] if held else []) + failed)
