"""`iris --help` lists every service subcommand, and importing the CLI loads no torch."""

import subprocess
import sys

from typer.testing import CliRunner

from iris.cli import app


def test_help_lists_the_subcommands():
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    for name in ("up", "models", "cache", "encoder", "llm", "gateway", "operator"):
        assert f" {name} " in result.output, result.output


def test_cli_import_is_light():
    code = "import sys, iris.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_bad_setting_exits_2_naming_the_key(tmp_path):
    env = {"IRIS_CACHE_PORT": "not-a-port", "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, "-m", "iris.cli", "cache"], capture_output=True, text=True, env=env
    )
    assert result.returncode == 2
    assert "IRIS_CACHE_PORT" in result.stderr
