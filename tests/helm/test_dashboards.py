"""The Grafana dashboards: valid JSON, every datasource a panel uses is declared as a
dashboard variable of the same type, every metric a query names is one of iris/metrics.py,
and the chart ships each file, unchanged, in a ConfigMap the Grafana sidecar picks up."""

from __future__ import annotations

import json
import re

import pytest

from iris import metrics
from tests.helm.chart import CHART, by_kind, load_values

DASHBOARDS = sorted((CHART / "dashboards").glob("*.json"))
# Suffixes Prometheus adds to histogram and counter series.
SERIES_SUFFIXES = ("_bucket", "_sum", "_count", "_created")
METRIC_TOKEN = re.compile(r"\biris_[a-z0-9_]+\b")


def load(path) -> dict:
    return json.loads(path.read_text())


def panels(board: dict) -> list[dict]:
    out = []
    for panel in board["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # collapsed rows
    return out


def metric_names(expr: str) -> set[str]:
    names = set()
    for token in METRIC_TOKEN.findall(expr):
        for suffix in SERIES_SUFFIXES:
            if token.endswith(suffix) and token[: -len(suffix)] in metrics.all_metric_names():
                token = token[: -len(suffix)]
                break
        names.add(token)
    return names


def test_the_expected_dashboards_exist():
    assert {p.stem for p in DASHBOARDS} == {"traces", "latency", "cache", "encoder", "operator"}
    uids = [load(p)["uid"] for p in DASHBOARDS]
    assert len(set(uids)) == len(uids)


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_datasources_are_declared(path):
    board = load(path)
    declared = {
        f"${{{var['name']}}}": var["query"]
        for var in board["templating"]["list"]
        if var["type"] == "datasource"
    }
    used = []
    for panel in panels(board):
        sources = [panel.get("datasource")] + [
            t.get("datasource") for t in panel.get("targets", [])
        ]
        for source in filter(None, sources):
            assert source["uid"] in declared, f"{panel['title']}: undeclared {source['uid']}"
            assert declared[source["uid"]] == source["type"], panel["title"]
            used.append(source["uid"])
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            source = var["datasource"]
            assert declared.get(source["uid"]) == source["type"], var["name"]
    assert set(used) == set(declared), "a declared datasource no panel uses"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_queried_metrics_exist(path):
    board = load(path)
    known = metrics.all_metric_names()
    exprs = [t["expr"] for p in panels(board) for t in p.get("targets", []) if "expr" in t]
    exprs += [v["definition"] for v in board["templating"]["list"] if v["type"] == "query"]
    for expr in exprs:
        names = metric_names(expr)
        assert names, f"{expr!r} queries no iris metric"
        assert names <= known, f"{path.name}: unknown metrics {sorted(names - known)}"


def test_metric_check_is_not_vacuous():
    assert metric_names("rate(iris_llm_time_to_first_token_seconds_bucket[5m])") <= (
        metrics.all_metric_names()
    )
    assert not metric_names("rate(iris_llm_ttft_bucket[5m])") <= metrics.all_metric_names()


def test_traces_dashboard_searches_tempo_by_service():
    board = load(CHART / "dashboards" / "traces.json")
    kinds = {p["type"] for p in panels(board)}
    assert "traces" in kinds  # the trace view
    queries = [
        t["query"] for p in panels(board) for t in p["targets"] if t.get("queryType") == "traceql"
    ]
    assert any("resource.service.name" in q and "$service" in q for q in queries)
    services = next(v for v in board["templating"]["list"] if v["name"] == "service")
    # The names the services give setup_tracing().
    assert {"iris-gateway", "iris-cache", "iris-operator"} <= set(services["query"].split(","))


@pytest.mark.parametrize("scenario", ["default", "full"])
def test_dashboards_ship_in_sidecar_configmaps(render, scenario):
    values = load_values(scenario)["dashboards"]
    configmaps = [
        cm
        for cm in by_kind(render(scenario), "ConfigMap").values()
        if values["label"] in cm["metadata"]["labels"]
    ]
    assert len(configmaps) == len(DASHBOARDS)
    shipped = {}
    for cm in configmaps:
        assert cm["metadata"]["labels"][values["label"]] == values["labelValue"]
        assert cm["metadata"]["annotations"]["grafana_folder"] == values["folder"]
        if values["namespace"]:
            assert cm["metadata"]["namespace"] == values["namespace"]
        ((name, text),) = cm["data"].items()
        shipped[name] = json.loads(text)
    assert shipped == {p.name: load(p) for p in DASHBOARDS}
