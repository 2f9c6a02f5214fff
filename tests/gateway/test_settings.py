"""Gateway settings: env names, list parsing, served model name, errors naming the key."""

import pytest

from gateway.errors import APIError
from gateway.service import Admission
from gateway.settings import GatewaySettings
from iris.multimodal.video import VideoLimits
from iris.settings import SettingsError


def test_env_names_and_lists(monkeypatch):
    monkeypatch.setenv("IRIS_GATEWAY_MODEL", "/models/tiny-vlm")
    monkeypatch.setenv("IRIS_GATEWAY_LLM_ADDRESSES", "10.0.0.1:50053,10.0.0.2:50053")
    monkeypatch.setenv("IRIS_GATEWAY_ENCODER_ADDRESSES", '["10.0.0.3:50051"]')
    monkeypatch.setenv("IRIS_GATEWAY_API_KEYS", "k1, k2")
    monkeypatch.setenv("IRIS_GATEWAY_DISCOVERY", "endpointslices")
    monkeypatch.setenv("IRIS_GATEWAY_EMBEDDING_REUSE", "false")
    settings = GatewaySettings.load()
    assert settings.llm_addresses == ["10.0.0.1:50053", "10.0.0.2:50053"]
    assert settings.encoder_addresses == ["10.0.0.3:50051"]
    assert settings.api_keys == ["k1", "k2"]
    assert settings.model_name == "tiny-vlm"
    assert settings.port == 8000 and not settings.embedding_reuse
    assert GatewaySettings.load(served_model_name="vlm").model_name == "vlm"


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"discovery": "dns"}, "IRIS_GATEWAY_DISCOVERY"),
        ({"llm_addresses": ["nohost"]}, "IRIS_GATEWAY_LLM_ADDRESSES"),
        ({"port": 0}, "IRIS_GATEWAY_PORT"),
        ({"max_image_bytes": -1}, "IRIS_GATEWAY_MAX_IMAGE_BYTES"),
        ({"video_max_groups": 0}, "IRIS_GATEWAY_VIDEO_MAX_GROUPS"),
        ({"video_max_decode_s": 0}, "IRIS_GATEWAY_VIDEO_MAX_DECODE_S"),
        ({"max_videos_per_request": 0}, "IRIS_GATEWAY_MAX_VIDEOS_PER_REQUEST"),
        ({"video_max_inflight_bytes": 0}, "IRIS_GATEWAY_VIDEO_MAX_INFLIGHT_BYTES"),
        ({"video_queue_timeout_s": -1}, "IRIS_GATEWAY_VIDEO_QUEUE_TIMEOUT_S"),
        ({"colour": "red"}, "IRIS_GATEWAY_COLOUR"),
    ],
)
def test_bad_values_name_the_key(overrides, key):
    with pytest.raises(SettingsError, match=key):
        GatewaySettings.load(model="/m", **overrides)


def test_video_settings_are_the_decoders_limits(monkeypatch):
    defaults = GatewaySettings.load(model="/m").video_limits()
    assert defaults == VideoLimits()  # the settings' defaults are the decoder's
    monkeypatch.setenv("IRIS_GATEWAY_VIDEO_MAX_DURATION_S", "12.5")
    monkeypatch.setenv("IRIS_GATEWAY_VIDEO_MAX_GROUPS", "7")
    limits = GatewaySettings.load(model="/m", video_max_bytes=1000).video_limits()
    assert limits.max_duration_s == 12.5 and limits.max_groups == 7
    assert limits.max_bytes == 1000


def test_admission_refuses_beyond_the_limit_with_retry_after():
    admission = Admission(limit=2, retry_after_s=3)
    admission.enter()
    admission.enter()
    with pytest.raises(APIError) as caught:
        admission.enter()
    assert caught.value.status == 429 and caught.value.retry_after == 3
    admission.leave()
    admission.enter()


def test_tenancy_is_per_key_when_keys_are_required_and_shared_when_open(monkeypatch):
    assert GatewaySettings.load(model="/m").tenancy == "shared"
    assert GatewaySettings.load(model="/m", api_keys=["k1", "k2"]).tenancy == "per-key"
    monkeypatch.setenv("IRIS_GATEWAY_API_KEYS", "k1")
    assert GatewaySettings.load(model="/m").tenancy == "per-key"
    monkeypatch.setenv("IRIS_GATEWAY_TENANCY", "shared")  # sharing between keys, on purpose
    assert GatewaySettings.load(model="/m").tenancy == "shared"
