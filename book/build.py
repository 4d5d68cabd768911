"""Build the kit's book: a static HTML site of the notebooks (committed outputs, nothing executed), README and docs/.

    python book/build.py [--out DIR] [--strict]

The sources (README.md, docs/, notebooks/, results/*.png and book/index.md) are staged in DIR/src at their
repository paths; Sphinx with MyST-NB (book/conf.py) writes DIR/html from them, executing nothing.
--strict turns warnings into errors. `make book` runs it with DIR = book/_build.
"""
import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

BOOK = Path(__file__).resolve().parent
REPO = BOOK.parent
# What the book shows, copied into the staged tree at the same relative paths, so that every relative link between
# them (README.md -> docs/cluster.md#..., docs/benchmarks/x.md -> ../../results/x.png) resolves as in the repository.
IGNORE = shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__", "*.json", "*.tmp")


def stage(src: Path) -> None:
    """Copy the book's sources into src (mtimes kept, so Sphinx rebuilds only what changed), book/index.md with them,
    and give each folder under docs/ without an index page one listing its pages (README links docs/benchmarks/)."""
    if src.exists():
        shutil.rmtree(src)
    src.mkdir(parents=True)
    shutil.copy2(BOOK / "index.md", src / "index.md")
    shutil.copy2(REPO / "README.md", src / "README.md")
    shutil.copytree(REPO / "docs", src / "docs", ignore=IGNORE)
    shutil.copytree(REPO / "notebooks", src / "notebooks", ignore=IGNORE)
    (src / "results").mkdir()
    for image in sorted((REPO / "results").glob("*.png")):
        shutil.copy2(image, src / "results" / image.name)
    for folder in sorted(p for p in (src / "docs").rglob("*") if p.is_dir()):
        if any(folder.glob("*.md")) and not (folder / "index.md").exists():
            (folder / "index.md").write_text(
                f"# {folder.name.capitalize()}\n\nThe pages of `{folder.relative_to(src)}/`.\n\n"
                "```{toctree}\n:glob:\n:maxdepth: 1\n\n*\n```\n")


def build(out: Path, strict: bool = False) -> int:
    """Stage the sources and run sphinx-build into out/html; return its exit status (warnings in out/warnings.txt)."""
    out = out.resolve()
    stage(out / "src")
    html = out / "html"
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-q", "-c", str(BOOK), "-d", str(out / "doctrees"),
           "-w", str(out / "warnings.txt"), "--keep-going", str(out / "src"), str(html)]
    if strict:
        cmd.insert(3, "-W")
    start = time.monotonic()
    rc = subprocess.run(cmd, cwd=REPO).returncode
    warnings = (out / "warnings.txt").read_text().strip() if (out / "warnings.txt").exists() else ""
    n = len([line for line in warnings.splitlines() if "WARNING" in line or "ERROR" in line])
    print(f"book: {'built' if rc == 0 else 'FAILED'} in {time.monotonic() - start:.0f} s, {n} warning(s)"
          f"{' (' + str(out / 'warnings.txt') + ')' if n else ''}; open {html / 'index.html'}"
          f" or serve it: python -m http.server -d {html} --bind 127.0.0.1 8000")
    return rc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=BOOK / "_build", help="build folder (default book/_build)")
    ap.add_argument("--strict", action="store_true", help="fail on any warning (sphinx-build -W)")
    args = ap.parse_args(argv)
    return build(args.out, args.strict)


if __name__ == "__main__":
    sys.exit(main())
