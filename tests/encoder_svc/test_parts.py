"""The small parts on their own: settings, owned tensors, the rate window, the CLI."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from encoder_svc.metrics import SlidingWindow
from encoder_svc.settings import EncoderSettings
from encoder_svc.tensors import owned_cpu, owns_storage
from iris.settings import SettingsError


def test_settings_read_the_agreed_environment_names(monkeypatch):
    monkeypatch.setenv("IRIS_ENCODER_MODEL", "/models/x")
    monkeypatch.setenv("IRIS_ENCODER_CACHE_ADDRESS", "cache:50052")
    monkeypatch.setenv("IRIS_ENCODER_DEVICE", "cuda")
    monkeypatch.setenv("IRIS_ENCODER_MAX_WAIT_MS", "7.5")
    settings = EncoderSettings.load(port=6000)
    assert (settings.model, settings.cache_address, settings.device) == (
        "/models/x",
        "cache:50052",
        "cuda",
    )
    assert settings.max_wait_ms == 7.5
    assert settings.port == 6000
    assert settings.metrics_port == 9101


def test_settings_errors_name_the_key(monkeypatch):
    monkeypatch.setenv("IRIS_ENCODER_DEVICE", "tpu")
    with pytest.raises(SettingsError, match="IRIS_ENCODER_DEVICE"):
        EncoderSettings.load()
    monkeypatch.delenv("IRIS_ENCODER_DEVICE")
    with pytest.raises(SettingsError, match="max_item_vision_tokens 100 exceeds"):
        EncoderSettings.load(max_item_vision_tokens=100, max_queue_vision_tokens=50)


def test_a_row_slice_of_a_batch_output_gets_its_own_storage():
    batch = torch.randn(10, 4)
    view = batch[3:6]
    assert not owns_storage(view)
    owned = owned_cpu(view)
    assert owns_storage(owned)
    assert owned.untyped_storage().data_ptr() != batch.untyped_storage().data_ptr()
    torch.testing.assert_close(owned, batch[3:6])
    fresh = torch.randn(3, 4)
    same = owned_cpu(fresh).untyped_storage().data_ptr() == fresh.untyped_storage().data_ptr()
    assert same  # already its own: no copy


def test_sliding_window_rate_and_busy_ratio():
    now = [100.0]
    window = SlidingWindow(window_s=10.0, clock=lambda: now[0])
    window.add(30)
    window.busy_start()
    now[0] += 2.0
    window.busy_end()
    window.busy_start()
    now[0] += 1.0  # a call still running counts so far
    assert window.rate() == 3.0
    assert window.busy_ratio() == pytest.approx(0.3)
    now[0] += 20.0
    window.busy_end()
    assert window.rate() == 0.0
    assert window.busy_ratio() == pytest.approx(1.0)  # the long call covered the window


def test_cli_module_imports_without_torch():
    code = "import sys, encoder_svc.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
