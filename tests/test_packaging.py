"""environment.yml and Dockerfile.gpu cannot be built here (no conda, no Docker daemon): check that they pin
the same versions as pyproject.toml and use the same Horovod install script."""
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PIN = re.compile(r"\b([A-Za-z][A-Za-z0-9_.-]*)(?:\[[^\]]*\])?==([0-9][^\s\"',;]*)")


def pins(text: str) -> dict[str, str]:
    return {name.lower().replace("_", "-"): version for name, version in PIN.findall(text)}


def project_pins() -> dict[str, str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return pins("\n".join(deps))


def test_every_dependency_is_pinned_exactly():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert len(project_pins()) == len(deps) > 10, [d for d in deps if "==" not in d]


def test_environment_yml_pins_exactly_the_pyproject_versions():
    assert pins((ROOT / "environment.yml").read_text()) == project_pins()


def test_dockerfile_pins_agree_with_pyproject():
    docker = pins((ROOT / "Dockerfile.gpu").read_text())
    assert docker, "Dockerfile.gpu pins nothing"
    assert {k: project_pins()[k] for k in docker} == docker   # KeyError if it pins something pyproject lacks


def test_one_install_script_everywhere():
    for f in ("environment.yml", "Dockerfile.gpu", "scripts/setup_env.sh"):
        assert "scripts/install_horovod.sh" in (ROOT / f).read_text(), f
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in (ROOT / "Dockerfile.gpu").read_text()
    assert (ROOT / "scripts/horovod-0.28.1-compat.patch").read_text().count("\n--- a/") == 5


def test_ci_runs_what_the_readme_says():
    ci = (ROOT / ".ci/run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "make test" in ci and "make test" in readme and "make lab" in readme
