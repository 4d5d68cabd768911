"""`python -m kit.bench render` (make docs): regenerate docs/benchmarks/NAME.md and the README's benchmark lists and
results lines from results/*.json and the BENCHES registry. Nothing between the markers is edited by hand:

    <!-- render NAME:summary -->              (a block: the markers on lines of their own)
    > the summary line of results/NAME.json
    <!-- /render -->
    ... K = <!-- render NAME:3 -->block 3 of kit.bench.pages.BLOCKS[NAME](x)<!-- /render --> ...   (inline)

The prose around the markers is the page's template; `render_text` fills every marker of a text from the data.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from kit.bench import BENCHES, GPU, LAB
from kit.bench.pages import BLOCKS
from kit.checks import fmt

MARKER = re.compile(r"<!-- render (?P<key>[\w:.-]+) -->(?P<body>.*?)<!-- /render -->", re.S)
README_LINE = 200            # a results line's head: clauses of the summary up to this many characters


def top_level_clauses(summary: str) -> list[str]:
    """Return a summary's clauses: split at '; ' outside parentheses."""
    out, depth, cur, i = [], 0, "", 0
    while i < len(summary):
        ch = summary[i]
        depth += (ch == "(") - (ch == ")")
        if depth == 0 and summary.startswith("; ", i):
            out.append(cur)
            cur, i = "", i + 2
            continue
        cur, i = cur + ch, i + 1
    return out + [cur]


def failed_checks(name: str, x: dict) -> list:
    """Return the checks of a run that did not hold (the benchmarks whose lessons are kit.checks values)."""
    if name == "ddp":
        from kit.ddp.lessons import all_checks
        return [c for c in all_checks(x) if not c.held]
    if name == "ddp_lab":
        from kit.ddp.lab import claims
        return [c for c in claims(x["runs"][-1]) if not c.held]
    if name == "mp":
        from kit.mp.lessons import bench_checks
        return [c for c in bench_checks(x) if not c.held]
    return []


def readme_line(name: str, x: dict) -> str:
    """Return the README's results line of a benchmark: each check that did not hold with its numbers, after as
    many of the summary's first clauses as fit in README_LINE characters (at least one); a summary clause
    that says something did not hold is always kept."""
    clauses = top_level_clauses(x["summary"])
    failed = failed_checks(name, x)
    where = f" at N = {x['runs'][-1]['N']}" if name == "ddp_lab" and failed else ""
    tail = "".join(f"; **{c.name}** did not hold{where}: {fmt(c.measured, c.unit)} (bound {fmt(c.bound, c.unit)})"
                   for c in failed)
    head = clauses[0].removeprefix(f"{name}: ").removeprefix(f"{name} ")
    for c in clauses[1:]:
        if "did not hold" in c or "FAILED" in c:
            head += "" if failed else "; " + c        # checks as values say it below, with their reasons
        elif not c.startswith("checks ") and len(head) + len(tail) + 2 + len(c) <= README_LINE:
            head += "; " + c
    return f"- [{name}](docs/benchmarks/{name}.md): {head}{tail}"


def readme_blocks(results: dict[str, dict]) -> dict[str, str]:
    """Return the README's generated blocks: the benchmark list, who needs root or a GPU, the results, the pages."""
    names = list(BENCHES)
    return {
        "readme:list": ", ".join(f"`{n}`" for n in names),
        "readme:needs": (", ".join(f"`{n}`" for n in LAB) + " need root (they build a lab) and "
                         + ", ".join(f"`{n}`" for n in GPU) + " an NVIDIA GPU"),
        "readme:results": "\n".join(readme_line(n, results[n]) for n in names if n in results),
        "readme:pages": ", ".join(f"[{n}](docs/benchmarks/{n}.md)" for n in names),
    }


def page_blocks(name: str, x: dict) -> dict[str, str]:
    """Return a benchmark page's generated blocks: its summary line and BLOCKS[name](x), numbered."""
    out = {f"{name}:summary": "> " + x["summary"]}
    out.update({f"{name}:{i}": block for i, block in enumerate(BLOCKS[name](x))})
    return out


def render_text(text: str, blocks: dict[str, str], where: str) -> str:
    """Return `text` with every marker's body replaced by its block; a marker with no block is an error."""
    def fill(m):
        if m.group("key") not in blocks:
            raise KeyError(f"{where}: no block {m.group('key')!r} to render (known: {', '.join(blocks)})")
        nl = "\n" if m.group("body").startswith("\n") else ""         # a block on lines of its own, or inline
        return f"<!-- render {m.group('key')} -->{nl}{blocks[m.group('key')]}{nl}<!-- /render -->"
    return MARKER.sub(fill, text)


def rendered(root: Path) -> dict[Path, str]:
    """Return {path: its text rendered} for the README and every benchmark page that has results."""
    results = {n: json.loads((root / "results" / f"{n}.json").read_text()) for n in BENCHES
               if (root / "results" / f"{n}.json").exists()}
    out = {}
    for name, x in results.items():
        page = root / "docs" / "benchmarks" / f"{name}.md"
        out[page] = render_text(page.read_text(), page_blocks(name, x), str(page.relative_to(root)))
    readme = root / "README.md"
    out[readme] = render_text(readme.read_text(), readme_blocks(results), "README.md")
    return out


def main(root: Path) -> int:
    """Write every rendered file that changed; say which."""
    for path, text in rendered(root).items():
        if path.read_text() != text:
            path.write_text(text)
            print(f"kit.bench render: rewrote {path.relative_to(root)}")
    return 0
