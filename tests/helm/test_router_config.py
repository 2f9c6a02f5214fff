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
