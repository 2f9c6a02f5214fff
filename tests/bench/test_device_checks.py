"""scripts/device_check.sh: its dry run on the fastest CPU twins writes a JSON that names every
check; one check failing, hanging or printing none of its figures never stops the others."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench import device_checks
from bench.device_checks import CHECKS, Check

ROOT = Path(__file__).resolve().parents[2]


def test_the_dry_run_of_the_fastest_twins_lists_every_check(tmp_path):
    run = subprocess.run(
        ["bash", str(ROOT / "scripts" / "device_check.sh"), "--dry-run", "--fast", str(tmp_path)],
        env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads((tmp_path / "device_check.json").read_text())
    assert report["mode"] == "dry-run"
    assert [check["name"] for check in report["checks"]] == [check.name for check in CHECKS]
    fast = {check.name for check in CHECKS if check.fast}
    assert fast
    for check in report["checks"]:
        assert check["status"] == ("PASS" if check["name"] in fast else "SKIP"), check
        assert check["name"] in run.stdout
    ran = [check for check in report["checks"] if check["status"] == "PASS"]
    assert all(check["ratios"] and check["returncode"] == 0 for check in ran)
    assert report["summary"] == {"PASS": len(fast), "FAIL": 0, "SKIP": len(CHECKS) - len(fast)}
    assert {entry["name"] for entry in report["not_built"]} >= {"cuda_graphs"}
    assert "===== fused_moe" in (tmp_path / "device_check.log").read_text()


def test_a_failing_and_a_hanging_check_do_not_stop_the_next(tmp_path, monkeypatch, capsys):
    def script(code: str) -> tuple[str, ...]:
        return ("-c", code)

    checks = (
        Check("fails", "exits 3", (), 5, twin=script("import sys; sys.exit(3)")),
        Check(
            "hangs", "sleeps", (), 5, twin=script("import time; time.sleep(60)"), twin_limit_s=1
        ),  # fmt: skip
        Check("gpu_only", "no twin", (), 5),
        Check("silent", "prints nothing", (), 5, twin=script("pass")),
        Check("passes", "ratio", (), 5, twin=script("print('ratio R 2.50  a / b')")),
    )
    monkeypatch.setattr(device_checks, "CHECKS", checks)
    monkeypatch.setattr(sys, "argv", ["device_checks.py", "--dry-run", str(tmp_path)])
    assert device_checks.main() == 1
    report = json.loads((tmp_path / "device_check.json").read_text())
    got = {c["name"]: (c["status"], c["reason"]) for c in report["checks"]}
    assert got == {
        "fails": ("FAIL", "exit status 3"),
        "hangs": ("FAIL", "timed out at 1 s"),
        "gpu_only": ("SKIP", "GPU-only: no CPU twin"),
        "silent": ("FAIL", "exit status 0 but none of its figures printed"),
        "passes": ("PASS", ""),
    }
    assert report["checks"][-1]["ratios"] == [{"label": "a / b", "value": 2.5}]
    assert "1 PASS, 3 FAIL, 1 SKIP" in capsys.readouterr().out
