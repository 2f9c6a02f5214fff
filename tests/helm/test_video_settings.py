"""The gateway's video bounds (issue 61) come from the chart's `gateway.video` values, at
the gateway's own defaults unless set; the schema refuses a value out of range; /dev/shm
has room for the bodies' 256Mi and the frames in flight."""

from __future__ import annotations

import pytest

from gateway.settings import GatewaySettings
from tests.helm.chart import load_values
from tests.helm.test_tenancy_defaults import gateway_env


def test_the_defaults_are_the_gateways(render):
    env = gateway_env(render())
    defaults = GatewaySettings.model_fields
    assert (
        int(env["IRIS_GATEWAY_MAX_VIDEOS_PER_REQUEST"])
        == defaults["max_videos_per_request"].default
    )
    assert (
        int(env["IRIS_GATEWAY_VIDEO_MAX_INFLIGHT_BYTES"])
        == defaults["video_max_inflight_bytes"].default
    )
    assert (
        float(env["IRIS_GATEWAY_VIDEO_QUEUE_TIMEOUT_S"])
        == defaults["video_queue_timeout_s"].default
    )
    shm_mi = int(load_values("default")["gateway"]["shmSizeLimit"].removesuffix("Mi"))
    assert shm_mi * 1024 * 1024 >= 256 * 1024 * 1024 + int(
        env["IRIS_GATEWAY_VIDEO_MAX_INFLIGHT_BYTES"]
    )


def test_values_reach_the_gateway(render):
    env = gateway_env(
        render(
            "default",
            "--set",
            "gateway.video.maxPerRequest=1",
            "--set",
            "gateway.video.maxInflightBytes=1073741824",
            "--set",
            "gateway.video.queueTimeoutSeconds=3",
        )
    )
    assert env["IRIS_GATEWAY_MAX_VIDEOS_PER_REQUEST"] == "1"
    assert env["IRIS_GATEWAY_VIDEO_MAX_INFLIGHT_BYTES"] == "1073741824"
    assert env["IRIS_GATEWAY_VIDEO_QUEUE_TIMEOUT_S"] == "3"


@pytest.mark.parametrize(
    "setting",
    ["gateway.video.maxPerRequest=0", "gateway.video.queueTimeoutSeconds=-1"],
)
def test_the_schema_refuses_out_of_range_values(render_error, setting):
    assert "video" in render_error("default", "--set", setting)
