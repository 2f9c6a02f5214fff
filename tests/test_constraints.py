"""constraints.txt pins the environment the suite passes on.

pyproject.toml states ranges; a fresh setup once resolved them to a redis-py release that
raised a different exception on a dropped connection, and a test failed on a fresh clone
that had passed the day before. scripts/setup.sh and docker/Dockerfile now install under
constraints.txt. These tests keep the file honest: every declared dependency is pinned,
inside the range pyproject.toml allows, and the environment running the suite is the
pinned one (which fails if setup stopped applying the file)."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parent.parent
CONSTRAINTS = REPO / "constraints.txt"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PIN_LINE = re.compile(r"(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[A-Za-z0-9.!]+)")


def pins() -> dict[str, str]:
    """Canonical distribution name -> pinned version."""
    out = {}
    for number, raw in enumerate(CONSTRAINTS.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = PIN_LINE.fullmatch(line)
        assert match, f"constraints.txt:{number}: {line!r} is not an exact name==version pin"
        name = canonicalize_name(match["name"])
        assert name not in out, f"constraints.txt:{number}: {name} is pinned twice"
        out[name] = match["version"]
    return out


def declared() -> list[Requirement]:
    """What the test environment installs: the dependencies and the dev extra. The cuda
    extra (fla-core) is for CUDA pods only, never installed here, so it has no pin."""
    project = PYPROJECT["project"]
    texts = project["dependencies"] + project["optional-dependencies"]["dev"]
    return [Requirement(text) for text in texts]


def test_every_line_is_an_exact_pin_of_a_distinct_distribution():
    assert len(pins()) > 50  # the whole environment, not just the direct dependencies


def test_the_project_itself_is_not_pinned():
    assert canonicalize_name(PYPROJECT["project"]["name"]) not in pins()


@pytest.mark.parametrize("requirement", declared(), ids=lambda r: r.name)
def test_each_declared_dependency_is_pinned_inside_its_range(requirement):
    pinned = pins().get(canonicalize_name(requirement.name))
    assert pinned, f"{requirement.name} is declared in pyproject.toml but not pinned"
    assert requirement.specifier.contains(Version(pinned), prereleases=True), (
        f"{requirement.name}=={pinned} is outside pyproject.toml's {requirement.specifier}"
    )


def test_setup_and_the_image_install_under_the_constraints():
    setup = (REPO / "scripts" / "setup.sh").read_text()
    installs = [line for line in setup.splitlines() if "pip install" in line]
    assert installs and all('"${PIN[@]}"' in line for line in installs), installs
    assert 'PIN=(-c "$ROOT/constraints.txt")' in setup
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    runs = re.findall(r"\bpip install[^\n]*", dockerfile)
    assert len(runs) >= 2 and all("-c constraints.txt" in run for run in runs), runs


def test_this_environment_is_the_pinned_one():
    """Every declared dependency, as installed here, is its pin (local labels aside)."""
    pinned = pins()
    drifted = {}
    for requirement in declared():
        name = canonicalize_name(requirement.name)
        installed = Version(importlib.metadata.version(requirement.name)).public
        if name not in pinned or Version(installed) != Version(pinned[name]):
            drifted[name] = f"installed {installed}, pinned {pinned.get(name)}"
    assert not drifted, f"the environment is not the pinned one: {drifted}"
