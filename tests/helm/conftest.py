"""Fixtures of the chart tests: the helm binary, and the chart rendered once per scenario.

Scenarios are the default values plus each file in tests/helm/values/; rendering runs the
real `helm template`, offline.
"""

from __future__ import annotations

import pytest
import yaml

from tests.helm.chart import find_helm, run_helm, template_args


@pytest.fixture(scope="session")
def helm() -> str:
    path = find_helm()
    if path is None:
        pytest.skip("helm not in .tools/helm nor on PATH (scripts/install_helm.sh installs it)")
    return path


@pytest.fixture(scope="session")
def render(helm):
    """render(scenario, *extra_args) -> the manifests (dicts); fails on a helm error."""
    cache: dict[tuple, list[dict]] = {}

    def _render(scenario: str = "default", *extra: str) -> list[dict]:
        key = (scenario, *extra)
        if key not in cache:
            result = run_helm(helm, *template_args(scenario, *extra))
            assert result.returncode == 0, f"helm template {key} failed:\n{result.stderr}"
            cache[key] = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
        return cache[key]

    return _render


@pytest.fixture(scope="session")
def render_error(helm):
    """render_error(scenario, *extra_args) -> helm's error text; fails if it renders."""

    def _render_error(scenario: str = "default", *extra: str) -> str:
        result = run_helm(helm, *template_args(scenario, *extra))
        assert result.returncode != 0, (
            f"helm template {scenario} {extra} rendered, expected a failure"
        )
        return result.stderr

    return _render_error
