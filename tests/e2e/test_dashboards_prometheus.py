"""Every PromQL query of every dashboard the chart ships, evaluated by a real Prometheus
scraping a real `iris up` platform (two LLM pods, an encoder, the Redis store) and a real
`iris operator` (against kmock), after a short mix of traffic.

The scrape configuration is `iris.up.prometheus.scrape_config` (what `iris up --prometheus`
uses) over the platform's own list of services. A missing prometheus binary fails the test:
scripts/setup.sh installs it.
"""

from __future__ import annotations

import json
import signal
import time
from datetime import UTC, datetime

import httpx
import openai
import pytest

from iris.up import prometheus as prometheus_module
from iris.up.platform import UpConfig
from iris.up.processes import wait_until
from iris.up.prometheus import Prometheus, prometheus_beside, scrape_config, start_beside_platform
from tests.e2e import operator_process as op
from tests.e2e.helpers import image_message, image_png
from tests.fixtures.platform import FAST_GATEWAY, TestPlatform
from tests.helm.chart import CHART
from tests.operators.kmock_api import AUTOSCALERS, DEPLOYMENTS, NS, PODS

pytestmark = pytest.mark.slow

# Two seconds (also the scrape timeout): a loaded machine can take over 1 s to answer.
SCRAPE_S = 2.0
# Grafana's $__rate_interval is at least four scrape intervals.
RATE_INTERVAL = f"{4 * SCRAPE_S:g}s"
# Queries that need an event this test does not cause: (dashboard, panel title, what
# would make the panel show data). At most 8.
NEEDS_AN_EVENT = {
    ("cache", "Validation discards by reason"): (
        "an entry that fails validation on read (a corrupt or mismatched embedding)"
    ),
    ("cache", "Store errors"): "the store failing a call (Redis down or timing out)",
    ("latency", "Retries by reason"): "an LLM pod failing mid-request, so the gateway retries",
    ("encoder", "Failures and rejections#0"): (
        "an image the encoder fails on after the gateway accepted it (a tower error)"
    ),
}


def dashboard_queries() -> list[tuple[str, str, str]]:
    """(dashboard, panel title, expr) for every Prometheus target of every dashboard; a
    panel's second and later queries are titled "<title>#<n>"."""
    found = []
    for path in sorted((CHART / "dashboards").glob("*.json")):
        board = json.loads(path.read_text())
        prometheus_vars = {
            f"${{{var['name']}}}"
            for var in board.get("templating", {}).get("list", [])
            if var["type"] == "datasource" and var["query"] == "prometheus"
        }
        panels = []
        for panel in board["panels"]:
            panels += [panel, *panel.get("panels", [])]
        for panel in panels:
            targets = [t for t in panel.get("targets", []) if "expr" in t]
            for index, target in enumerate(targets):
                source = target.get("datasource") or panel.get("datasource") or {}
                if source.get("uid") not in prometheus_vars:
                    continue
                title = panel["title"] if len(targets) == 1 else f"{panel['title']}#{index}"
                found.append((path.stem, title, target["expr"]))
    return found


def substitute(expr: str) -> str:
    return expr.replace("$__rate_interval", RATE_INTERVAL).replace("$namespace", ".*")


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_qwen2_vl_dir):
    """The platform, the operator (with kmock) and Prometheus scraping them all. The
    operator and Prometheus start while the platform does (its ports are planned first)."""
    log_dir = tmp_path_factory.mktemp("dashboards")
    platform = TestPlatform(
        UpConfig(
            model_dir=tiny_qwen2_vl_dir,
            log_dir=log_dir,
            llm_pods=2,
            cache="redis",
            extra_env={"gateway": FAST_GATEWAY},
        )
    )
    stoppers = [platform.stop]
    try:
        platform.plan()
        llm = platform.service("llm-0").child.env["IRIS_LLM_METRICS_PORT"]
        encoder = platform.service("encoder-0").child.env["IRIS_ENCODER_METRICS_PORT"]
        kube = op.KubeEmulator(
            {
                (DEPLOYMENTS, NS, "iris-llm"): op.deployment("iris-llm", 1),
                # An idle encoder pool of 3: the operator scales it down (scale events).
                (DEPLOYMENTS, NS, "iris-encoder"): op.deployment("iris-encoder", 3),
                (PODS, NS, "llm-0"): op.pod("llm-0", "127.0.0.1", "llm"),
                # Ready, but nothing listens there: the operator's scrape failures.
                (PODS, NS, "llm-gone"): op.pod("llm-gone", "127.0.0.3", "llm"),
                (PODS, NS, "encoder-0"): op.pod("encoder-0", "127.0.0.1", "encoder"),
                (AUTOSCALERS, NS, "pair"): op.autoscaler(int(llm), int(encoder)),
            }
        )
        kube.start()
        stoppers.append(kube.stop)
        operator, operator_address = op.start_operator(kube.url, log_dir)
        stoppers.append(operator.stop)
        # What `iris up --prometheus` runs (with the chart's rules), plus the operator.
        prometheus = prometheus_beside(
            platform.services,
            log_dir / "prometheus",
            interval_s=SCRAPE_S,
            operator_address=operator_address,
        )
        prometheus.launch()
        stoppers.append(prometheus.stop)
        platform.start()
        prometheus.wait_ready()
        op.wait_operator(operator, operator_address)
        yield platform, prometheus, operator_address
    finally:
        # SIGTERM everything at once, then wait for each: the services stop side by side.
        for service in platform.services:
            service.child.signal_group(signal.SIGTERM)
        for stop in reversed(stoppers):
            stop()


def send_traffic(platform) -> None:
    """Text, streamed text, images (one repeated), a structured answer, and a refused one."""
    client = platform.openai_client(max_retries=0)
    model = platform.model_name
    text = [{"role": "user", "content": "Say hello."}]
    client.chat.completions.create(model=model, messages=text, max_tokens=4)
    stream = client.chat.completions.create(model=model, messages=text, max_tokens=4, stream=True)
    assert list(stream)
    for seed in (1, 1, 2):
        client.chat.completions.create(
            model=model, messages=image_message(image_png(seed)), max_tokens=4
        )
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    client.chat.completions.create(
        model=model,
        messages=text,
        max_tokens=16,
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
    )
    # Refused at the door (a 4xx: 400 or 422, whichever the gateway answers schema errors with).
    with pytest.raises(openai.APIStatusError) as refused:
        client.chat.completions.create(model=model, messages=text, max_tokens=-1)
    assert 400 <= refused.value.status_code < 500


def operator_has_acted(address: str) -> bool:
    """The operator has scaled once and failed one scrape (the events its panels show)."""
    page = httpx.get(f"http://{address}/metrics", timeout=2.0).text
    counted = [
        line
        for line in page.splitlines()
        if line.startswith(("iris_operator_scale_events_total{", "iris_operator_scrape_failures"))
        and not line.split("{")[0].endswith("_created")
    ]
    names = {line.split("{")[0] for line in counted if float(line.rsplit(" ", 1)[1]) > 0}
    return names == {"iris_operator_scale_events_total", "iris_operator_scrape_failures_total"}


def _seconds(rfc3339: str) -> float:
    """Prometheus's lastScrape (nanoseconds, Z) as a Unix time."""
    stamp, _, fraction = rfc3339.rstrip("Z").partition(".")
    whole = datetime.fromisoformat(stamp).replace(tzinfo=UTC).timestamp()
    return whole + float(f"0.{fraction or 0}")


def wait_for_scrapes(prometheus: Prometheus, after: float, scrapes: int = 2) -> None:
    """Until every target has been scraped successfully `scrapes` times since `after`."""
    for _ in range(scrapes):

        def scraped_since(moment: float = after) -> bool:
            targets = prometheus.api("targets")["activeTargets"]
            return all(t["health"] == "up" and _seconds(t["lastScrape"]) > moment for t in targets)

        assert wait_until(scraped_since, 60, 0.2), [
            (t["labels"]["pod"], t["health"], t["lastScrape"], t["lastError"])
            for t in prometheus.api("targets")["activeTargets"]
            if t["health"] != "up"
        ]
        after = time.time()


def test_every_dashboard_query_returns_data(stack):
    platform, prometheus, operator_address = stack
    send_traffic(platform)
    assert wait_until(lambda: operator_has_acted(operator_address), 60, 0.2)
    wait_for_scrapes(prometheus, after=time.time())

    queries = dashboard_queries()
    assert len(queries) >= 60
    assert len(NEEDS_AN_EVENT) <= 8
    listed = set(NEEDS_AN_EVENT)
    assert listed <= {(board, title) for board, title, _ in queries}, "a listed panel is gone"
    empty = []
    for board, title, expr in queries:
        if (board, title) in listed:
            continue
        if not prometheus.query(substitute(expr)):
            empty.append(f"{board} / {title}: {expr}")
    assert not empty, "queries without a series:\n" + "\n".join(empty)


def test_targets_carry_namespace_and_pod_labels(stack):
    _, prometheus, _ = stack
    pods = {t["labels"]["pod"] for t in prometheus.api("targets")["activeTargets"]}
    assert {"cache", "encoder-0", "llm-0", "llm-1", "gateway", "operator"} <= pods
    assert prometheus.query('count(up{namespace="iris-up"}) > 0')


def test_scrape_config_reads_each_services_metrics_port(stack):
    platform, _, _ = stack
    config = scrape_config(platform.services, interval_s=SCRAPE_S)
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert "redis" not in jobs  # Redis has no /metrics
    llm_targets = [c["targets"][0] for c in jobs["llm"]["static_configs"]]
    assert llm_targets == [
        f"127.0.0.1:{platform.service(name).child.env['IRIS_LLM_METRICS_PORT']}"
        for name in ("llm-0", "llm-1")
    ]
    for job in jobs.values():
        for target in job["static_configs"]:
            assert httpx.get(f"http://{target['targets'][0]}/metrics").status_code == 200


# The service-level indicators the chart's rules record, each with data after the traffic.
RECORDED = [
    "iris:ttft_seconds:p50",
    "iris:ttft_seconds:p99",
    'iris:gateway_requests:ratio_rate5m{status_class="4xx"}',
    "iris:availability:ratio_rate5m",
    "iris:encoder_backlog:seconds",
    "iris:embedding_cache_hit:ratio_rate5m",
    "iris:kv_utilisation:max",
    # The repeated image above is routed for a prefix hit (predicted > 0).
    "iris:gateway_routing_precision:ratio_rate5m",
    # Every reason's regret series is exported from the start: the share is 0, not absent.
    "iris:gateway_routing_regret:ratio_rate5m",
    # The pods run without a host KV tier, but export its series at 0 from the start.
    "iris:llm_kv_tier_bytes:rate5m",
    "iris:llm_kv_tier_fill:max",
    # Nor a KV store, whose series are exported at 0 from the start too.
    "iris:llm_kv_store_hits:rate5m",
    "iris:llm_kv_store_bytes:rate5m",
    "iris:llm_kv_store_dropped_writes:rate5m",
]


def test_the_rules_are_loaded_and_record_the_indicators(stack):
    """Runs after the traffic test (same module): the recording rules see its requests."""
    _, prometheus, _ = stack
    groups = {group["name"] for group in prometheus.api("rules")["groups"]}
    assert {"iris-sli", "iris-alerts"} <= groups
    for record in RECORDED:
        assert wait_until(lambda r=record: prometheus.query(r), 30, 0.2), record


def test_without_a_binary_iris_up_says_so_and_serves_on(stack, monkeypatch, tmp_path):
    """--prometheus with no prometheus on PATH nor in .tools/ (both pointed elsewhere)."""
    platform, _, _ = stack
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(prometheus_module, "TOOLS_DIR", tmp_path)
    said = []
    stop = start_beside_platform(platform, lambda text, err=False: said.append((text, err)))
    stop()
    ((text, err),) = said
    assert err and "prometheus not found" in text and "scripts/setup.sh" in text
