"""The alert and recording rules (helm/iris/rules/iris.rules.yaml) as the chart renders
them, checked and unit-tested by the real promtool; and every dashboard's PromQL, wrapped
in a temporary recording rule (promtool 2.42 cannot check a bare expression), checked too.

A missing promtool fails these tests: scripts/setup.sh installs it into .tools/.
"""

from __future__ import annotations

import json
import re
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
# Non-default burn-rate windows and factors; 10m and 12h are windows the rules file does
# not record, so the chart must render their error-ratio recording rules.
BURN_VALUES = (
    "prometheusRule.burnRates.fast[0].long=2h",
    "prometheusRule.burnRates.fast[0].short=10m",
    "prometheusRule.burnRates.fast[0].factor=4",
    "prometheusRule.burnRates.slow[0].long=12h",
    "prometheusRule.burnRates.slow[0].short=1h",
    "prometheusRule.burnRates.slow[0].factor=0.5",
)
BURN_CASES = Path(__file__).parent / "rules" / "burn_windows.yaml"
BURN_ALERTS = {
    "IrisAvailabilityBudgetBurnFast": (
        "iris:availability_errors",
        "availability",
        "2h",
        "10m",
        "4",
    ),
    "IrisTTFTBudgetBurnFast": ("iris:ttft_slow", "ttft", "2h", "10m", "4"),
    "IrisAvailabilityBudgetBurnSlow": (
        "iris:availability_errors",
        "availability",
        "12h",
        "1h",
        "0.5",
    ),
    "IrisTTFTBudgetBurnSlow": ("iris:ttft_slow", "ttft", "12h", "1h", "0.5"),
}


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


def by_name(groups: list[dict]) -> dict[str, dict]:
    return {rule.get("record") or rule["alert"]: rule for g in groups for rule in g["rules"]}


def test_default_values_render_the_plain_file(rendered_rules):
    # The burn-rate expressions are rebuilt from values; the defaults give back the file.
    plain = yaml.safe_load(RULES.read_text())["groups"]
    assert yaml.safe_load(rendered_rules.read_text())["groups"] == plain


def test_burn_rate_windows_and_factors_from_values(helm, promtool, tmp_path):
    groups = rendered_groups(helm, *BURN_VALUES)
    rules = by_name(groups)
    for alert, (prefix, objective, long, short, factor) in BURN_ALERTS.items():
        cut = f"> on () group_left () ({factor} * (1 - iris:slo:{objective}_objective))"
        expected = (
            f"(\n  {prefix}:ratio_rate{long} {cut}\n  and {prefix}:ratio_rate{short} {cut}\n)\n"
        )
        assert rules[alert]["expr"] == expected, alert
    assert "at 4x its rate" in rules["IrisAvailabilityBudgetBurnFast"]["annotations"]["description"]
    # Every error ratio any rule reads is recorded; the new windows' rules read their window.
    read = set(
        re.findall(r"iris:(?:availability_errors|ttft_slow):ratio_rate\w+", json.dumps(groups))
    )
    assert read <= set(rules), f"read but not recorded: {read - set(rules)}"
    for prefix in ("iris:availability_errors", "iris:ttft_slow"):
        for window in ("10m", "12h"):
            expr = rules[f"{prefix}:ratio_rate{window}"]["expr"]
            assert f"[{window}]" in expr and "[1h]" not in expr
    assert 'le="2.5"' in rules["iris:ttft_slow:ratio_rate10m"]["expr"]
    # promtool accepts the rendered rules: the file's rules plus four new recording rules.
    path = tmp_path / "rendered.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    plain = sum(len(g["rules"]) for g in yaml.safe_load(RULES.read_text())["groups"])
    output = promtool_run(promtool, "check", "rules", str(path))
    assert f"SUCCESS: {plain + 4} rules found" in output


def test_burn_rate_alerts_fire_on_the_values_windows(helm, promtool, rendered_rules, tmp_path):
    """burn_windows.yaml's cases pass on the rules rendered with BURN_VALUES and fail on
    the defaults' (every firing case there is silent under the workbook's factors)."""
    (tmp_path / "custom").mkdir()
    (tmp_path / "default").mkdir()
    custom = tmp_path / "custom" / "rendered.rules.yaml"
    custom.write_text(yaml.safe_dump({"groups": rendered_groups(helm, *BURN_VALUES)}))
    (tmp_path / "default" / "rendered.rules.yaml").write_text(rendered_rules.read_text())
    for where in ("custom", "default"):
        (tmp_path / where / BURN_CASES.name).write_text(BURN_CASES.read_text())
    assert "SUCCESS" in promtool_run(
        promtool, "test", "rules", BURN_CASES.name, cwd=tmp_path / "custom"
    )
    result = subprocess.run(
        [promtool, "test", "rules", BURN_CASES.name],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path / "default",
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert output.count("got:[]") == 3, output
    for alert in (
        "IrisAvailabilityBudgetBurnFast",
        "IrisTTFTBudgetBurnFast",
        "IrisAvailabilityBudgetBurnSlow",
    ):
        assert f"alertname: {alert}" in output, output


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
