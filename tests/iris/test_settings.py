"""The settings base: env prefixes, address lists, errors naming the key."""

import pytest
from pydantic_settings import SettingsConfigDict

from iris.settings import AddressList, ServiceSettings, SettingsError


class DemoSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="IRIS_DEMO_", extra="forbid")
    port: int = 1234
    peers: AddressList = []


def test_env_prefix_and_overrides(monkeypatch):
    monkeypatch.setenv("IRIS_DEMO_PORT", "4321")
    assert DemoSettings.load().port == 4321
    assert DemoSettings.load(port=99).port == 99
    assert DemoSettings.load(port=None).port == 4321  # None means "not given"


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("a:1,b:2", ["a:1", "b:2"]),
        ('["a:1", "10.0.0.1:50051"]', ["a:1", "10.0.0.1:50051"]),
        ("", []),
        ("[::1]:80", ["[::1]:80"]),
    ],
)
def test_address_lists_from_env(monkeypatch, raw, expected):
    monkeypatch.setenv("IRIS_DEMO_PEERS", raw)
    assert DemoSettings.load().peers == expected


@pytest.mark.parametrize("raw", ["nohost", "a:0", "a:70000", "a:x"])
def test_bad_address_names_key_and_value(monkeypatch, raw):
    monkeypatch.setenv("IRIS_DEMO_PEERS", raw)
    with pytest.raises(SettingsError, match=r"peers \(env IRIS_DEMO_PEERS\)") as info:
        DemoSettings.load()
    assert raw in str(info.value)


def test_bad_type_names_key(monkeypatch):
    monkeypatch.setenv("IRIS_DEMO_PORT", "many")
    with pytest.raises(SettingsError, match="IRIS_DEMO_PORT"):
        DemoSettings.load()


def test_unknown_override_refused():
    with pytest.raises(SettingsError, match="nonsense"):
        DemoSettings.load(nonsense=1)


def test_unknown_env_var_with_the_prefix_is_refused(monkeypatch):
    monkeypatch.setenv("IRIS_DEMO_PROT", "1")
    with pytest.raises(SettingsError, match="unknown setting.*IRIS_DEMO_PROT.*IRIS_DEMO_PORT"):
        DemoSettings.load()
