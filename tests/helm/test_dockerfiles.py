"""The Dockerfiles, checked statically: that they agree with the project (packages, pins,
entry point), with the chart (user, ports, writable paths, image names) and with the usual
hardening rules. No Docker engine runs on these machines: CI builds and runs the image with
buildah instead (scripts/build_image.sh, scripts/image_check.sh), after the suite."""

from __future__ import annotations

import json
import re
import shlex
import tomllib

import pytest
import yaml

from iris import metrics
from tests.helm.chart import CHART, REPO, containers, env_of, workloads

DOCKER = REPO / "docker"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
CHART_META = yaml.safe_load((CHART / "Chart.yaml").read_text())


def instructions(path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    out, pending = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        text = pending + line
        pending = ""
        keyword, _, rest = text.partition(" ")
        out.append((keyword.upper(), rest.strip()))
    assert not pending, f"{path.name} ends inside a continued line"
    return out


def stages(steps):
    """The instructions of each build stage, in order (global ARGs dropped)."""
    out = []
    for keyword, rest in steps:
        if keyword == "FROM":
            out.append([])
        if out:
            out[-1].append((keyword, rest))
    return out


MAIN = instructions(DOCKER / "Dockerfile")
FINAL = stages(MAIN)[-1]
MODEL = instructions(DOCKER / "Dockerfile.model")


def env_of_stage(steps) -> dict[str, str]:
    env = {}
    for keyword, rest in steps:
        if keyword == "ENV":
            for item in shlex.split(rest):
                key, _, value = item.partition("=")
                env[key] = value
    return env


def test_python_matches_the_project():
    (arg,) = [rest for keyword, rest in MAIN if keyword == "ARG" and "PYTHON_IMAGE" in rest]
    assert re.fullmatch(r"PYTHON_IMAGE=python:3\.11[-.\w]*", arg)
    assert "3.11" in PYPROJECT["project"]["requires-python"]
    froms = [rest for keyword, rest in MAIN if keyword == "FROM"]
    assert all(f.startswith("${PYTHON_IMAGE}") for f in froms)


def test_torch_pin_is_the_projects():
    (pin,) = [d for d in PYPROJECT["project"]["dependencies"] if d.startswith("torch")]
    runs = " ".join(rest for keyword, rest in MAIN if keyword == "RUN")
    assert f'"{pin}"' in runs


def test_every_package_and_file_is_copied_and_in_the_context():
    copies = [shlex.split(rest) for keyword, rest in MAIN if keyword == "COPY"]
    sources = {
        src.rstrip("/")
        for args in copies
        if not any(a.startswith("--from") for a in args)
        for src in args[:-1]
    }
    packages = {
        p.rstrip("*") for p in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    }
    assert packages <= sources, f"packages not copied: {sorted(packages - sources)}"
    assert {"pyproject.toml", PYPROJECT["project"]["readme"]} <= sources
    for source in sources:
        assert (REPO / source).exists(), f"COPY {source}: not in the repository"
    ignore = (DOCKER / "Dockerfile.dockerignore").read_text().splitlines()
    assert "**" in ignore  # everything else stays out of the context (.venv, .git, .cache)
    for source in sources:
        assert f"!{source}" in ignore or f"!{source}/" in ignore, f"{source} is excluded"


def test_runs_as_the_charts_non_root_user():
    users = [rest for keyword, rest in FINAL if keyword == "USER"]
    assert users, "the runtime stage must set USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and gid.isdigit(), "numeric, so runAsNonRoot can be verified"
    assert int(uid) == VALUES["podSecurityContext"]["runAsUser"] != 0
    assert int(gid) == VALUES["podSecurityContext"]["runAsGroup"]
    model_user = [rest for keyword, rest in MODEL if keyword == "USER"][-1]
    assert model_user.split(":")[0].isdigit() and model_user.split(":")[0] != "0"


def test_entrypoint_is_tini_then_the_iris_cli():
    (entry,) = [rest for keyword, rest in FINAL if keyword == "ENTRYPOINT"]
    argv = json.loads(entry)  # exec form: the process gets signals directly
    assert argv[0].endswith("tini") and argv[-1] == "iris"
    assert "iris" in PYPROJECT["project"]["scripts"]


def test_exposes_the_service_ports():
    (exposed,) = [rest for keyword, rest in FINAL if keyword == "EXPOSE"]
    ports = {int(p) for p in exposed.split()}
    assert ports == set(metrics.DEFAULT_PORTS.values()) | set(metrics.METRICS_PORTS.values())


def test_writable_paths_are_the_charts_scratch_mounts(render):
    """The image's cache variables point where the chart mounts emptyDirs."""
    env = env_of_stage(FINAL)
    (gateway,) = containers(workloads(render())["gateway"], init=False)
    chart_env = env_of(gateway)
    mounts = {m["mountPath"] for m in gateway["volumeMounts"]}
    for name in ("HOME", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "HF_HOME"):
        assert env[name] == chart_env[name]["value"], name
        assert any(env[name] == m or env[name].startswith(m + "/") for m in mounts), name
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"  # the root filesystem is read-only
    assert env["HF_HUB_OFFLINE"] == "1"  # models come from mounted directories only


def test_image_names_match_the_chart(render):
    text = (DOCKER / "Dockerfile").read_text()
    tag = f"{VALUES['image']['repository']}:{CHART_META['appVersion']}"
    assert f"-t {tag} " in text
    assert f"-t {tag}{VALUES['image']['cpuTagSuffix']} " in text
    images = {
        c["image"]
        for w in workloads(render()).values()
        for c in containers(w)
        if "iris" in c["image"]
    }
    assert images == {tag, tag + VALUES["image"]["cpuTagSuffix"]}


def test_model_image_layout_matches_the_chart():
    (copy,) = [shlex.split(rest) for keyword, rest in MODEL if keyword == "COPY"]
    assert copy[-1].rstrip("/") == VALUES["model"]["image"]["path"].rstrip("/")
    (base,) = [rest for keyword, rest in MODEL if keyword == "FROM"]
    assert ":" in base and not base.endswith(":latest")


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.model"])
def test_hardening_rules(name):
    steps = instructions(DOCKER / name)
    assert not [rest for keyword, rest in steps if keyword == "ADD"], "use COPY, never ADD"
    for keyword, rest in steps:
        if keyword == "RUN" and "apt-get install" in rest:
            assert "--no-install-recommends" in rest
            assert "apt-get update" in rest and "rm -rf /var/lib/apt/lists" in rest
        if keyword == "FROM":
            assert not rest.split()[0].endswith(":latest")
        if keyword in ("ENV", "ARG"):
            assert not re.search(r"(PASSWORD|TOKEN|SECRET)\w*=", rest), rest
