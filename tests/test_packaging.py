"""environment.yml and Dockerfile.gpu cannot be built here (no conda, no Docker daemon): check that they pin
the same versions as pyproject.toml and use the same Horovod install script. The README and docs/: every benchmark
page is its results/NAME.json rendered, every `make` target, `python -m` module, variable and link they name exists."""
import importlib.util
import json
import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PIN = re.compile(r"\b([A-Za-z][A-Za-z0-9_.-]*)(?:\[[^\]]*\])?==([0-9][^\s\"',;]*)")


def pins(text: str) -> dict[str, str]:
    return {name.lower().replace("_", "-"): version for name, version in PIN.findall(text)}


def project_pins() -> dict[str, str]:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    return pins("\n".join(deps))


def test_every_dependency_is_pinned_exactly():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert len(project_pins()) == len(deps) > 10, [d for d in deps if "==" not in d]


def test_environment_yml_pins_exactly_the_pyproject_versions():
    assert pins((REPO / "environment.yml").read_text()) == project_pins()


def test_dockerfile_pins_agree_with_pyproject():
    docker = pins((REPO / "Dockerfile.gpu").read_text())
    assert docker, "Dockerfile.gpu pins nothing"
    assert {k: project_pins()[k] for k in docker} == docker   # KeyError if it pins something pyproject lacks


def test_one_install_script_everywhere():
    for f in ("environment.yml", "scripts/setup_env.sh"):
        assert "scripts/install_horovod.sh" in (REPO / f).read_text(), f
    assert "RUN make setup" in (REPO / "Dockerfile.gpu").read_text()      # which runs setup_env.sh
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in (REPO / "Dockerfile.gpu").read_text()
    # the file sections of the patch: 6 for the compat fixes 1-4 and the kit's torch-ops option, 28 headers
    # for fix 5 (GCC >= 13 includes), 1 for fix 6 (Python 3.12 has no distutils)
    assert (REPO / "scripts/horovod-0.28.1-compat.patch").read_text().count("\n--- a/") == 6 + 28 + 1


def test_ci_runs_what_the_readme_says():
    ci = (REPO / ".ci/run").read_text()
    readme = (REPO / "README.md").read_text()
    assert "make test" in ci and "make test" in readme and "make lab" in readme


# --- install anywhere (issue 16) and the GPU image (issue 14) ------------------------------------------------


def stamp(**env) -> str:
    """The set-up stamp scripts/setup_env.sh would write for this environment (nothing is installed)."""
    out = subprocess.run(["bash", "scripts/setup_env.sh", "--print-stamp"], cwd=REPO, capture_output=True,
                         text=True, env={**os.environ, **env}, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.engines
def test_the_stamp_records_the_torch_build_and_the_gpu_operations():
    """A set-up with other choices is not 'up to date': make never keeps a CPU Horovod where NCCL was asked."""
    cases = [dict(TORCH=t, HOROVOD_GPU_OPERATIONS=g) for t in ("cpu", "cuda") for g in ("", "NCCL")]
    stamps = [stamp(**c) for c in cases]
    assert len(set(stamps)) == len(cases), dict(zip(map(str, cases), stamps))
    assert stamp(**cases[3]) == stamps[3]                     # and it is deterministic


@pytest.mark.engines
def test_a_bad_torch_choice_is_a_clear_error():
    out = subprocess.run(["bash", "scripts/setup_env.sh"], cwd=REPO, capture_output=True, text=True,
                         env={**os.environ, "TORCH": "rocm", "VENV": "/nonexistent/venv"}, timeout=60)
    assert out.returncode != 0 and "TORCH must be auto, cpu or cuda" in out.stderr


def test_horovod_cache_key_records_gpu_ops_frameworks_and_torch_ops():
    script = (REPO / "scripts/install_horovod.sh").read_text()
    key = next(line for line in script.splitlines() if line.startswith("key="))
    for part in ("$gpu_ops", "$torch_ops", "$tf_v", "$torch_v", "$patch_sum"):
        assert part in key, part
    assert "KIT_HOROVOD_TORCH_CUDA=0" in script                            # CUDA torch, no GPU: CPU ops
    assert 'STREQUAL "0"' in (REPO / "scripts/horovod-0.28.1-compat.patch").read_text()


def test_docker_image_records_its_setup_and_ignores_host_state():
    docker = (REPO / "Dockerfile.gpu").read_text()
    env_lines = " ".join(line for line in docker.splitlines() if line.startswith(("ENV", "    ")))
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in env_lines and "TORCH=cuda" in env_lines   # image-wide, not one RUN
    assert "RUN make setup" in docker            # the stamp is written by the same set-up `make lab` checks
    assert "install_horovod.sh" in (REPO / "scripts/setup_env.sh").read_text()
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".venv/", ".git/"} <= set(ignored)
    assert "make test-gpu" in docker and "test-gpu:" in (REPO / "Makefile").read_text()


def test_ci_runs_the_fresh_user_check():
    ci = (REPO / ".ci/run").read_text()
    assert "scripts/ci_fresh_user.sh" in ci
    fresh = (REPO / "scripts/ci_fresh_user.sh").read_text()
    for must in ("useradd", "su - ", "git clone", "make setup", "00_environment.ipynb", "make lab", "userdel"):
        assert must in fresh, must


@pytest.mark.engines
def test_make_test_gpu_refuses_without_a_gpu():
    has_gpu = subprocess.run("nvidia-smi -L 2>/dev/null | grep -q ^GPU", shell=True).returncode == 0
    out = subprocess.run(["make", "-s", "gpu-present"], cwd=REPO, capture_output=True, text=True, timeout=60)
    if has_gpu:
        assert out.returncode == 0, out.stderr
    else:
        assert out.returncode != 0 and out.stderr.strip().splitlines()[0].startswith("make test-gpu: no NVIDIA GPU")


# --- the README and docs/: what they say is what the code and results/*.json hold ------------------------------
DOCS = REPO / "docs"
README_MAX_LINES = 260


def _texts() -> dict[str, str]:
    """README.md and every page under docs/: {path relative to the repository: text}."""
    paths = [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]
    return {str(p.relative_to(REPO)): p.read_text() for p in paths}


FENCE = re.compile(r"^```.*?^```", re.S | re.M)
INLINE = re.compile(r"`([^`\n]+)`")


def _code(text: str) -> list[str]:
    """The code a page shows: its fenced blocks and its inline `code` spans."""
    blocks = FENCE.findall(text)
    return blocks + INLINE.findall(FENCE.sub("", text))


def test_every_benchmark_has_a_page_renderer():
    from kit.bench import BENCHES
    from kit.bench.pages import BLOCKS
    assert set(BLOCKS) == set(BENCHES)


def test_the_committed_docs_are_what_make_docs_writes():
    """docs/benchmarks/*.md and the README are what `python -m kit.bench render` (make docs) writes from
    results/*.json: nothing between its markers is edited by hand."""
    from kit.bench import render
    stale = [str(path.relative_to(REPO)) for path, text in render.rendered(REPO).items() if path.read_text() != text]
    assert not stale, f"run `make docs` (python -m kit.bench render): {stale} differ from what it renders"


def test_every_benchmark_page_shows_its_summary_and_its_blocks():
    from kit.bench import BENCHES, render
    for name in BENCHES:
        page = (DOCS / "benchmarks" / f"{name}.md").read_text()
        keys = {m.group("key") for m in render.MARKER.finditer(page)}
        x = json.loads((REPO / "results" / f"{name}.json").read_text())
        assert f"python -m kit.bench {name}" in page and f"results/{name}.json" in page
        assert keys == set(render.page_blocks(name, x)), f"{name}.md: every block once at least, and no other"


def test_the_readme_lists_every_benchmark_of_the_registry():
    from kit.bench import BENCHES
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## Results at a glance"):]
    section = section[:section.index("\n## ")]
    lines = re.findall(r"^- \[(\w+)\]\(docs/benchmarks/(\w+)\.md\): (.+)$", section, re.M)
    assert [n for n, _, _ in lines] == list(BENCHES) and all(n == page for n, page, _ in lines)
    for name in BENCHES:
        assert f"`{name}`" in readme and f"[{name}](docs/benchmarks/{name}.md)" in readme
    assert len(re.findall(r"!\[[^\]]*\]\(results/\w+\.png\)", section)) == 2, "two figures"


def test_a_results_line_is_short_and_gives_a_failed_checks_numbers(monkeypatch):
    from kit.bench import render
    from kit.checks import Check
    x = {"summary": "ddp_lab: N=3 gloo engines; " + "; ".join(f"clause {i} " + "x" * 40 for i in range(9)),
         "runs": [{"N": 3}]}
    monkeypatch.setattr(render, "failed_checks", lambda name, x: [])
    line = render.readme_line("ddp_lab", x)
    assert len(line.split(": ", 1)[1]) <= render.README_LINE and "clause 0" in line and "clause 8" not in line
    bad = Check("overlap", measured=1.3, bound="≤ 1.15", held=False, unit="×")
    monkeypatch.setattr(render, "failed_checks", lambda name, x: [bad])
    line = render.readme_line("ddp_lab", x)
    assert line.endswith("; **overlap** did not hold at N = 3: 1.30× (bound ≤ 1.15)"), line
    assert len(line.split(": ", 1)[1]) <= render.README_LINE


def test_the_readme_is_the_front_door_not_the_manual():
    n = len((REPO / "README.md").read_text().splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines (at most {README_MAX_LINES}): move the detail to docs/"


def _make_targets() -> set[str]:
    targets = set()
    for line in (REPO / "Makefile").read_text().splitlines():
        if line.startswith(".PHONY:"):
            targets |= set(line.split(":", 1)[1].split())
        elif (m := re.match(r"([A-Za-z0-9][\w.-]*(?:[ \t]+[A-Za-z0-9][\w.-]*)*)[ \t]*:(?!=)", line)):
            targets |= set(m.group(1).split())
    return targets


MAKE = re.compile(r"(?:^|[\s(;&|])make\s+(?:(?:-\S+|[A-Z_][A-Z0-9_]*=\S*)\s+)*([a-z][\w-]*)", re.M)


def test_every_make_target_the_docs_name_is_in_the_makefile():
    targets = _make_targets()
    assert {"setup", "lab", "test", "test-fast", "test-gpu", "bench", "lint", "clean"} <= targets, targets
    named = {(t, where) for where, text in _texts().items() for code in _code(text) for t in MAKE.findall(code)}
    in_readme = {t for t, where in named if where == "README.md"}
    assert {"lab", "test", "test-fast", "test-gpu", "bench", "lint", "clean"} <= in_readme, in_readme
    bad = sorted(f"make {t} ({where})" for t, where in named if t not in targets)
    assert not bad, "make targets the docs name that the Makefile lacks:\n" + "\n".join(bad)


README_RUNS = {"kit.bench", "kit.mnist.train"}      # the python -m commands the README's five minutes show
PYTHON_M = re.compile(r"\bpython3?\s+-m\s+([A-Za-z_][\w.]*)|\"-m\",\s*\"([A-Za-z_][\w.]*)\"")


def test_every_python_m_module_the_docs_name_exists():
    named = {(a or b, where) for where, text in _texts().items() for a, b in PYTHON_M.findall(text)}
    assert README_RUNS <= {m for m, where in named if where == "README.md"}
    bad = sorted(f"python -m {m} ({where})" for m, where in named if importlib.util.find_spec(m) is None)
    assert not bad, "modules the docs run with python -m that do not exist:\n" + "\n".join(bad)


ASSIGNED = re.compile(r"(?<![\w$])([A-Z][A-Z0-9]*_[A-Za-z0-9_]+|[A-Z][A-Z0-9]{2,})=")   # OMPI_MCA_btl= too


def _variables(text: str) -> set[str]:
    """The environment variables a page names: `NAME=...` in its code, and the first column of a table whose
    header's first cell is 'variable'."""
    names = {n for code in _code(text) for n in ASSIGNED.findall(code)}
    in_table = False
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if not cells:
            in_table = False
        elif cells[0] == "variable":
            in_table = True
        elif in_table and (m := re.fullmatch(r"`([A-Z][A-Z0-9_]{2,})`", cells[0])):
            names.add(m.group(1))
    return names


def test_every_variable_the_docs_name_is_read_or_set_by_the_code():
    code = "\n".join(p.read_text(errors="replace") for p in
                     [REPO / "Makefile", REPO / "tests" / "conftest.py", *(REPO / "scripts").rglob("*"),
                      *(REPO / "kit").rglob("*.py")] if p.is_file())
    named = {(v, where) for where, text in _texts().items() for v in _variables(text)}
    readme = {v for v, where in named if where == "README.md"}
    assert {"PYTEST_ARGS", "LAB_PORT", "TORCH", "PYTHON_BOOT"} <= readme, readme
    bad = sorted(f"{v} ({where})" for v, where in named if not re.search(rf"\b{v}\b", code))
    assert not bad, ("variables the docs name that no Makefile, script, kit module or tests/conftest.py "
                     "mentions:\n" + "\n".join(bad))


LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _anchor(heading: str) -> str:
    """GitHub's anchor for a markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_relative_link_in_the_readme_and_docs_points_to_a_file():
    bad = []
    for where, text in _texts().items():
        prose = INLINE.sub("", FENCE.sub("", text))
        for target in LINK.findall(prose):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (REPO / where).parent / path if path else REPO / where
            if not dest.exists():
                bad.append(f"{where}: {target} (no such file)")
            elif anchor and dest.suffix == ".md":
                anchors = {_anchor(h) for h in re.findall(r"^#+ (.+)$", FENCE.sub("", dest.read_text()), re.M)}
                if anchor not in anchors:
                    bad.append(f"{where}: {target} (no such heading)")
    assert not bad, "broken links:\n" + "\n".join(bad)


def test_the_readme_says_python_3_11_and_quotes_no_tracker():
    for where, text in _texts().items():
        assert not re.search(r"Python\s*(?:≥|>=)?\s*3\.10", text), where
        assert not re.search(r"\bissues?\s+#?\d+", text, re.I), f"{where} quotes an internal tracker"
    assert "Python ≥ 3.11" in (REPO / "README.md").read_text()
