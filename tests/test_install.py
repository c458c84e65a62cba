"""The README's commands install what the shipped configs need, and CI runs the README's test command."""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
CPU_CONFIGS = ["speech.toml", "qwen3-omni.toml", "qwen2.5-omni.toml"]
# A CPU config that needs more than the first command installs names the extra its own section of the
# README tells users to add.
CONFIG_EXTRAS = {"qwen3-omni.toml": ["omni"], "qwen2.5-omni.toml": ["omni"]}
COMMANDS = re.findall(r"^    (python3 -m venv .*)$", README, re.M)
# What loading and validating a config imports beyond omnitrio.config_loading itself, as top-level module names.
PROBE = """
import json, sys
from omnitrio.config_loading import load
before = set(sys.modules)
load(sys.argv[1])
print(json.dumps(sorted({name.partition(".")[0] for name in set(sys.modules) - before})))
"""

pytestmark = pytest.mark.timeout(300)  # pip and python subprocesses: past the global 120 s when busy


def extras(command: str) -> list[str]:
    (found,) = re.findall(r"pip install (?:-q )?-e '\.\[([^\]]*)\]'", command)
    return found.split(",")


def installs(names: list[str]) -> set[str]:
    """The distributions that installing omnitrio with ``names`` as extras brings in (from what is installed here)."""
    pending = [Requirement(r) for r in PYPROJECT["dependencies"]]
    pending += [Requirement(r) for name in names for r in PYPROJECT["optional-dependencies"][name]]
    seen: set[str] = set()
    while pending:
        requirement = pending.pop()
        name = canonicalize_name(requirement.name)
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = importlib.metadata.requires(requirement.name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for text in requires:
            nested = Requirement(text)
            wanted = requirement.extras or {""}
            if nested.marker is None or any(nested.marker.evaluate({"extra": extra}) for extra in wanted):
                pending.append(nested)
    return seen


def imported_distributions(config: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(ROOT / "configs" / config)], capture_output=True, text=True, check=True
    )
    owners = importlib.metadata.packages_distributions()
    modules = json.loads(done.stdout)
    return {canonicalize_name(dist) for module in modules for dist in owners.get(module, [])} - {"omnitrio"}


def test_the_readme_gives_a_first_command_and_a_test_command() -> None:
    assert len(COMMANDS) == 2 and "omnitrio serve" in COMMANDS[0] and "pytest" in COMMANDS[1]


@pytest.mark.parametrize("config", CPU_CONFIGS)
def test_the_first_command_installs_what_checking_a_shipped_cpu_config_imports(config: str) -> None:
    missing = imported_distributions(config) - installs(extras(COMMANDS[0]) + CONFIG_EXTRAS.get(config, []))
    assert not missing, f"check configs/{config} imports {sorted(missing)}, which the README's first command lacks"


@pytest.mark.parametrize(("config", "names"), sorted(CONFIG_EXTRAS.items()))
def test_the_readme_tells_how_to_install_the_extra_a_config_needs(config: str, names: list[str]) -> None:
    for name in names:
        assert f"pip install -e '.[{name}]'" in README and f"configs/{config}" in README


def test_torch_is_pinned_wherever_an_extra_names_it() -> None:
    for name, requirements in PYPROJECT["optional-dependencies"].items():
        for requirement in map(Requirement, requirements):
            if requirement.name == "torch":
                assert str(requirement.specifier) == "==2.13.0", name


def test_ci_runs_exactly_the_readme_test_command() -> None:
    script = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert script[-1] == COMMANDS[1]


def weights_packages() -> list[str]:
    lines = (ROOT / "requirements" / "weights.txt").read_text().splitlines()
    return [Requirement(line.split()[0]).name for line in lines if line.strip() and not line.startswith("#")]


@pytest.mark.parametrize("order", ["first then test", "test then first"])
def test_neither_command_after_the_other_brings_anything_a_weights_package_declares(order: str) -> None:
    """The weights are installed ``--no-deps``; pip re-checks such a package whenever an install brings
    one of its declared requirements new, and prints every requirement it lacks as an ``ERROR`` line."""
    earlier, later = COMMANDS if order == "first then test" else COMMANDS[::-1]
    new = installs(extras(later)) - installs(extras(earlier))
    for package in weights_packages():
        try:
            requires = [Requirement(text) for text in importlib.metadata.requires(package) or []]
        except importlib.metadata.PackageNotFoundError:
            continue
        declared = {canonicalize_name(r.name) for r in requires if r.marker is None or r.marker.evaluate({"extra": ""})}
        assert not declared & new, f"{package} declares {sorted(declared & new)}, which the later command installs new"
