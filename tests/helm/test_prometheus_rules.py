"""The alert and recording rules (helm/iris/rules/iris.rules.yaml) as the chart renders
them, checked and unit-tested by the real promtool; and every dashboard's PromQL, wrapped
in a temporary recording rule (promtool 2.42 cannot check a bare expression), checked too.

A missing promtool fails these tests: scripts/setup.sh installs it into .tools/.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from iris.up.prometheus import find_tool
from tests.helm.chart import CHART, KUBE_VERSION, run_helm

RULES = CHART / "rules" / "iris.rules.yaml"
UNIT_TESTS = sorted((Path(__file__).parent / "rules").glob("*_test.yaml"))
# The release name whose pods the unit tests name (iris-llm-0, ...): fullname "iris".
RELEASE = "iris"


@pytest.fixture(scope="module")
def promtool() -> str:
    path = find_tool("promtool")
    if path is None:
        pytest.fail("promtool not on PATH nor in .tools/ (scripts/setup.sh installs it)")
    return path


def rendered_groups(helm: str, *sets: str) -> list[dict]:
    args = ["template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION]
    args += ["--show-only", "templates/prometheusrule.yaml", "--set", "prometheusRule.enabled=true"]
    for item in sets:
        args += ["--set", item]
    result = run_helm(helm, *args)
    assert result.returncode == 0, result.stderr
    (rule,) = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    assert rule["kind"] == "PrometheusRule"
    return rule["spec"]["groups"]


@pytest.fixture(scope="module")
def rendered_rules(helm, tmp_path_factory) -> Path:
    """The chart's PrometheusRule (default values) as a plain rules file."""
    path = tmp_path_factory.mktemp("rules") / "iris.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rendered_groups(helm)}, sort_keys=False))
    return path


def promtool_run(promtool: str, *args: str, cwd: Path | None = None) -> str:
    result = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120, cwd=cwd)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    return output


def test_plain_and_rendered_rules_pass_promtool_check(promtool, rendered_rules):
    promtool_run(promtool, "check", "rules", str(RULES))
    output = promtool_run(promtool, "check", "rules", str(rendered_rules))
    plain = yaml.safe_load(RULES.read_text())["groups"]
    count = sum(len(group["rules"]) for group in plain)
    assert f"SUCCESS: {count} rules found" in output


def test_unit_tests_pass_on_the_rendered_rules(promtool, rendered_rules, tmp_path):
    for source in UNIT_TESTS:
        spec = yaml.safe_load(source.read_text())
        spec["rule_files"] = [str(rendered_rules)]
        copy = tmp_path / source.name
        copy.write_text(yaml.safe_dump(spec, sort_keys=False))
        assert "SUCCESS" in promtool_run(promtool, "test", "rules", str(copy))


def test_every_alert_is_tested_firing_and_silent():
    alerts = {
        rule["alert"]
        for group in yaml.safe_load(RULES.read_text())["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }
    fires, silent = set(), set()
    for source in UNIT_TESTS:
        for case in yaml.safe_load(source.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (fires if check.get("exp_alerts") else silent).add(check["alertname"])
    assert alerts == fires, f"never seen firing: {alerts - fires}"
    assert alerts == silent, f"never seen silent: {alerts - silent}"


def test_values_set_objectives_threshold_and_for(helm):
    groups = rendered_groups(
        helm,
        "prometheusRule.objectives.availability=0.999",
        "prometheusRule.ttftThresholdSeconds=5",
        "prometheusRule.for.IrisPodNotReady=10m",
    )
    rules = {rule.get("record") or rule["alert"]: rule for g in groups for rule in g["rules"]}
    assert rules["iris:slo:availability_objective"]["expr"] == "vector(0.999)"
    assert rules["iris:slo:ttft_objective"]["expr"] == "vector(0.95)"
    assert 'le="5"' in rules["iris:ttft_slow:ratio_rate1h"]["expr"]
    assert 'le="2.5"' not in json.dumps(groups)
    assert rules["IrisPodNotReady"]["for"] == "10m"
    assert 'pod=~"iris-.*"' in rules["IrisPodNotReady"]["expr"]


def test_dashboard_queries_pass_promtool_check(promtool, tmp_path):
    rules = []
    for path in sorted((CHART / "dashboards").glob("*.json")):
        board = json.loads(path.read_text())
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                if "expr" not in target:
                    continue
                expr = target["expr"].replace("$__rate_interval", "4m")
                expr = expr.replace("$namespace", ".*")
                rules.append({"record": f"dashboard:{path.stem}:q{len(rules)}", "expr": expr})
    assert len(rules) >= 60
    wrapped = tmp_path / "dashboards.rules.yaml"
    wrapped.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    assert f"SUCCESS: {len(rules)} rules found" in promtool_run(
        promtool, "check", "rules", str(wrapped)
    )
