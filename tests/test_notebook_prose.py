"""Notebook prose never states a number its run did not print.

For every notebook under notebooks/ (appendix and solutions included), every decimal number (`3.7`), percentage
(`73.5%`, `96%`) and ratio (`6.6×`, `1.66x`) written in a markdown cell must appear in the same notebook's
committed outputs, or be on the short allow-list below with the reason it is not a measurement. Sentences about a
run's numbers belong in a cell that renders them (`IPython.display.Markdown(f"...")`), so that re-running the
notebook can never leave the prose and the outputs disagreeing.

Not checked: whole numbers without a % or × (step numbers, sizes, settings such as "a 4 MB message"), and text
inside code (inline `code` spans and fenced or indented code blocks: parameter values and commands, not claims).
"""
import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"

# token -> why it may appear in prose without being printed by the run. Keep it short; add a reason for each.
ALLOW = {
    "0.28.1": "Horovod's version",
    "2.0": "a version or formula constant, not a measurement",
    "1.0": "Adadelta's learning rate in the article's Keras example (a setting)",
    "0.001": "Adam's learning rate in Horovod's TF2 Keras example (a setting)",
    "100%": "the definition of a fully busy accelerator / full efficiency",
    "0%": "the empty end of a utilisation scale",
    "90%": "a target in an exercise's statement (not a measurement)",
    "3%": "an exercise's answer tolerance (notebook 01)",
}

# a number (1,746 or 3.7 or 0.28.1), then: a percent sign, or × / x written against it (6.6×; "4 × 128" is a product)
NUMBER = re.compile(r"(?<![\w.])(\d+(?:,\d{3})*(?:\.\d+)*)(\s?%|[×x](?![\w])|)")


def strip_code(text: str) -> str:
    """Remove fenced and indented code blocks, inline code spans, links' targets and HTML tags."""
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    text = "\n".join(line for line in text.splitlines() if not line.startswith("    ") or line.lstrip()[:1] in "-*")
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    return re.sub(r"<[^>]+>", " ", text)


def claims(text: str) -> list[str]:
    """Return the tokens of `text` that state a measured-looking number: decimals, percentages, ratios."""
    out = []
    for m in NUMBER.finditer(strip_code(text)):
        number, unit = m.group(1), m.group(2).strip()
        if unit in ("×", "x"):
            out.append(number + "x")
        elif unit == "%" or "." in number:
            out.append(number + unit)
    return out


def outputs_text(nb: dict) -> str:
    """Return every text a notebook's code cells printed or displayed, joined."""
    parts = []
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            parts.append("".join(out.get("text", "")))
            for mime in ("text/plain", "text/markdown", "text/html"):
                parts.append("".join(out.get("data", {}).get(mime, "")))
    return "\n".join(parts)


def printed(token: str, outputs: str) -> bool:
    """Is `token` (e.g. '73.5%', '6.6x', '3.7') in the outputs, as a whole number with the same unit?"""
    number, unit = re.fullmatch(r"([\d.,]+)(%|x|)", token).groups()
    tail = {"%": r"\s?%", "x": r"\s?[×x]", "": r"(?![\d])"}[unit]
    return re.search(rf"(?<![\d.]){re.escape(number)}{tail}", outputs) is not None


def unbacked(path: Path) -> list[tuple[int, str]]:
    """Return (cell index, token) for every number in markdown that the outputs do not show."""
    nb = json.loads(path.read_text())
    outputs = outputs_text(nb)
    missing = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "markdown":
            for token in claims("".join(cell["source"])):
                if token not in ALLOW and not printed(token, outputs):
                    missing.append((i, token))
    return missing


def test_the_checker_finds_numbers_and_their_units():
    text = ("Busy 73.5% (was 54 %), 6.6× faster, `IO_MS = 0.6` not, 3.7 ms, step 12, 4 × 128, 1,746 samples/s, "
            "version 0.28.1\n\n    x = 4.5\n")
    assert claims(text) == ["73.5%", "54%", "6.6x", "3.7", "0.28.1"]
    assert printed("6.6x", "speed-up 6.6x") and printed("73.5%", "busy 73.5%") and printed("3.7", "3.7 ms")
    assert not printed("3.7", "13.75 ms") and not printed("6.6x", "6.6 ms") and not printed("5%", "95%")


NOTEBOOK_FILES = sorted(p for p in NOTEBOOKS.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)


@pytest.mark.parametrize("path", NOTEBOOK_FILES, ids=lambda p: str(p.relative_to(NOTEBOOKS)))
def test_every_number_in_prose_is_printed_by_the_run(path):
    missing = unbacked(path)
    assert not missing, (
        f"{path.name}: numbers in markdown that no output shows (cell index: token): "
        + ", ".join(f"{i}: {t}" for i, t in missing)
        + ". Render such sentences from the run's values (IPython.display.Markdown), or, for a constant, "
          "add it to ALLOW in tests/test_notebook_prose.py with the reason.")


MAIN_PATH_CELLS = 45     # a lab long: depth goes to notebooks/appendix/


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("0*.ipynb")), ids=lambda p: p.name)
def test_main_path_is_a_lab_long(path):
    cells = json.loads(path.read_text())["cells"]
    assert len(cells) <= MAIN_PATH_CELLS, (f"{path.name} has {len(cells)} cells on its main path (at most "
                                           f"{MAIN_PATH_CELLS}): move depth into notebooks/appendix/")


def test_the_ring_walkthrough_figure_is_saved_as_an_image():
    """Notebook 03's step-by-step ring figure is in the committed output as a PNG (GitHub and nbviewer have no
    widget state: a slider alone would show them nothing); the slider is drawn after it, for a live kernel."""
    nb = json.loads((NOTEBOOKS / "03_ring_allreduce.ipynb").read_text())
    (cell,) = [c for c in nb["cells"] if c["cell_type"] == "code" and "plot_ring_steps(" in "".join(c["source"])]
    kinds = [k for o in cell["outputs"] for k in o.get("data", {})]
    assert "image/png" in kinds, kinds
