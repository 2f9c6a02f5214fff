"""The router.yaml the chart mounts is one the gateway's own parser accepts."""

from __future__ import annotations

import pytest
import yaml

from gateway.routing import config
from tests.helm.chart import SCENARIOS, by_kind


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_gateway_parses_the_router_config(render, scenario):
    (configmap,) = [
        cm
        for name, cm in by_kind(render(scenario), "ConfigMap").items()
        if name.endswith("-router")
    ]
    document = yaml.safe_load(configmap["data"]["router.yaml"])
    chain = config.parse_router_config(document)
    assert chain.filters or chain.scorers


def test_the_charts_default_router_is_the_built_in_default(render):
    """The chart's router values are the gateway's built-in `prefix-aware` policy, so a
    cluster routes as `iris up` and the design page say."""
    configmaps = by_kind(render("default"), "ConfigMap")
    (configmap,) = [cm for name, cm in configmaps.items() if name.endswith("-router")]
    mounted = yaml.safe_load(configmap["data"]["router.yaml"])
    assert mounted == yaml.safe_load(config.BUILTIN_POLICIES["prefix-aware"])
