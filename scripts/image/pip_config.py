"""The host's pip configuration, prepared for bind-mounting into image build steps
(scripts/build_image.sh).

    python scripts/image/pip_config.py STAGE

Reads the configuration pip resolves here (`pip config list`: its files and PIP_* variables,
the variables winning) and writes it as STAGE/.config/pip/pip.conf, which the build mounts
read-only over /root, so pip in a build step finds it as root's own configuration. Local
paths it names (wheel folders, file:// indexes, a certificate bundle, a constraints file)
are renamed under /root/.host/ and printed, one `HOST_PATH:CONTAINER_PATH` a line, for the
build to mount read-only; their mount points are created inside STAGE.

Why everything goes under /root: buildah creates a mount point that the image lacks (as
/etc/pip.conf or /opt/wheels) in the step's layer and keeps it there, an empty file or
folder in the shipped image; /root exists in every Debian image, and what is mounted below
it gets its mount points in STAGE instead.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from configparser import ConfigParser
from pathlib import Path

CONTAINER_HOME = "/root"
HOST_PREFIX = f"{CONTAINER_HOME}/.host"
# An absolute path or a file:// URL inside a configuration value.
LOCAL = re.compile(r"(file://)?(/[^\s'\"]+)")


def resolved_config() -> dict[tuple[str, str], str]:
    """(section, key) -> value as pip resolves them; PIP_* variables go to [global]."""
    listing = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], check=True, capture_output=True, text=True
    ).stdout
    files, env = {}, {}
    for line in listing.splitlines():
        name, _, value = line.partition("=")
        section, _, key = name.rpartition(".")
        if section == ":env:":
            env[("global", key)] = ast.literal_eval(value)
        else:
            files[(section, key)] = ast.literal_eval(value)
    return {**files, **env}


def mount_root(path: str) -> str:
    """What to mount for a local path: a file:// index's pages link to its files beside
    simple/ (../../files/...), so the folder holding simple/ goes in whole."""
    stripped = path.rstrip("/")
    return stripped[: -len("/simple")] if stripped.endswith("/simple") else stripped


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    stage = Path(argv[0])
    mounts: dict[str, str] = {}

    def rename(match: re.Match) -> str:
        scheme, path = match.group(1) or "", match.group(2)
        root = mount_root(path)
        if not Path(root).exists():
            return match.group(0)  # not a local path on this host: leave it to pip
        mounts[root] = HOST_PREFIX + root
        return scheme + HOST_PREFIX + path

    config = ConfigParser(interpolation=None)
    for (section, key), value in resolved_config().items():
        if not config.has_section(section):
            config.add_section(section)
        config.set(section, key, LOCAL.sub(rename, value))

    conf = stage / ".config" / "pip" / "pip.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    with conf.open("w") as out:
        config.write(out)
    for host, container in sorted(mounts.items()):
        # The mount point, made here in STAGE (mounted read-only), never in the image.
        point = stage / Path(container).relative_to(CONTAINER_HOME)
        if Path(host).is_dir():
            point.mkdir(parents=True, exist_ok=True)
        else:
            point.parent.mkdir(parents=True, exist_ok=True)
            point.touch()
        print(f"{host}:{container}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
