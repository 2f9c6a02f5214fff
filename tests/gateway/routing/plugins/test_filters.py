"""Filters `healthy` and `not-saturated`."""

import pytest

from gateway.routing.kv_index import KVIndex
from gateway.routing.plugins import create_plugin
from gateway.routing.pods import Pod, PodLoad


def pod(address, *, healthy=True, refused=None, waiting=0, kv=0.0):
    return Pod(
        address,
        page_size=4,
        healthy=healthy,
        refused=refused,
        load=PodLoad(kv_utilisation=kv, waiting=waiting),
    )


def test_healthy_keeps_usable_pods_only():
    pods = [pod("a"), pod("b", healthy=False), pod("c", refused="fingerprint")]
    kept = create_plugin("healthy").filter(None, pods, KVIndex())
    assert [p.address for p in kept] == ["a"]


def test_not_saturated_drops_pods_over_either_limit():
    plugin = create_plugin("not-saturated", {"max_waiting": 2, "max_kv_utilisation": 0.9})
    pods = [pod("a", waiting=2, kv=0.5), pod("b", waiting=3), pod("c", kv=0.95)]
    assert [p.address for p in plugin.filter(None, pods, KVIndex())] == ["a"]
    assert plugin.empty_status == 429


def test_bad_params_are_refused_with_the_plugin_name():
    with pytest.raises(ValueError, match="not-saturated"):
        create_plugin("not-saturated", {"max_waiting": 1, "unknown": 2})
    with pytest.raises(ValueError, match="max_kv_utilisation"):
        create_plugin("not-saturated", {"max_kv_utilisation": 1.5})
