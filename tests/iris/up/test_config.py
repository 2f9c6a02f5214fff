"""`iris up`'s configuration: bad values are refused with the value named."""

from pathlib import Path

import pytest

from iris.up.platform import Platform, UpConfig


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"cache": "disk"}, "cache must be memory, redis or redis-cluster, got 'disk'"),
        ({"router": "fastest"}, "router must be prefix or round-robin, got 'fastest'"),
        ({"llm_pods": 0}, "need at least one LLM pod"),
        ({"services": ("encoder",)}, "services must be one of"),
        ({"services": ("cache", "llm")}, "services must be one of"),
    ],
)
def test_bad_configs_are_refused(overrides, fragment):
    with pytest.raises(ValueError, match=fragment):
        UpConfig(model_dir=Path("."), **overrides)


def test_a_leading_part_of_the_platform_plans_only_that_part(tmp_path):
    platform = Platform(
        UpConfig(model_dir=tmp_path, services=("cache", "encoder"), log_dir=tmp_path)
    )
    platform.plan()
    assert [service.kind for service in platform.services] == ["cache", "encoder"]
