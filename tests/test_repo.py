"""The repository's own rules: the linter passes, one Python floor said the same way everywhere, `make clean`
removes what the build makes, and the tiers `make test-fast` deselects are the ones the conftest registers."""
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import conftest

REPO = Path(__file__).resolve().parents[1]
FLOOR = (3, 11)


@pytest.mark.engines        # ruff in a subprocess
def test_the_linter_passes():
    """ruff, configured in pyproject.toml; RUF100 makes each `# noqa` name a rule it really silences."""
    p = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "kit", "tests", "scripts"], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr


def test_one_python_floor_everywhere():
    want = "%d.%d" % FLOOR
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["project"]["requires-python"] == f">={want}"
    assert project["tool"]["ruff"]["target-version"] == "py%d%d" % FLOOR
    assert f"python={want}" in (REPO / "environment.yml").read_text()
    assert f"sys.version_info >= {FLOOR}" in (REPO / "scripts" / "setup_env.sh").read_text()
    assert f"Python >= {want}" in (REPO / "Dockerfile.gpu").read_text()
    readme = (REPO / "README.md").read_text()
    floors = set(re.findall(r"Python (?:≥|>=) ?(3\.\d+)", readme))
    assert floors == {want}, f"the README gives the Python floor as {floors}, not {want}"
    assert sys.version_info >= FLOOR


@pytest.mark.engines        # make in a subprocess
def test_make_clean_removes_what_the_build_makes(tmp_path):
    """`make clean` in a copy: the venv, metadata, caches go; the sources stay."""
    copy = tmp_path / "repo"
    shutil.copytree(REPO, copy, ignore=shutil.ignore_patterns(".venv", ".git", "results", "notebooks"))
    made = [copy / ".venv" / "bin", copy / ".pytest_cache", copy / ".ruff_cache", copy / "kit.egg-info",
            copy / "kit" / "comm" / "__pycache__", copy / "build" / "lib"]
    for d in made:
        d.mkdir(parents=True, exist_ok=True)
    p = subprocess.run(["make", "-s", "clean"], cwd=copy, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert [d for d in made if d.exists()] == []
    assert (copy / "kit" / "comm" / "ring.py").exists() and (copy / "Makefile").exists()


def test_test_fast_deselects_exactly_the_tiers_the_conftest_registers():
    makefile = (REPO / "Makefile").read_text()
    fast = re.search(r"^test-fast:.*?-m \"not \((.*?)\)\"", makefile, re.M | re.S).group(1)
    assert set(fast.split(" or ")) == set(conftest.TIERS)


def test_the_tests_the_plain_user_check_names_exist():
    """scripts/ci_fresh_user.sh runs some tests by node id: each must still be a test function in its file (a
    renamed test there makes CI's plain-user check collect nothing and fail)."""
    script = (REPO / "scripts" / "ci_fresh_user.sh").read_text()
    named = re.findall(r"(tests/\w+\.py)::(\w+)", script)
    assert named, "expected the script to name the cluster tests it runs"
    for path, name in named:
        assert re.search(rf"^def {name}\(", (REPO / path).read_text(), re.M), f"{path}::{name} is not a test there"
