"""`iris up --cache redis-cluster`: a local Redis Cluster of three masters (replicas
optional) on loopback ports, joined with `redis-cli --cluster create`, for trying the
cluster store. Each node is a child process like every other service."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from iris.up.processes import ChildProcess, free_port, wait_until

HOST = "127.0.0.1"
JOIN_TIMEOUT_S = 60.0


class ClusterStartError(RuntimeError):
    """The cluster could not be started or joined; the message says which step."""


def cluster_nodes(
    data_dir: Path,
    log_dir: Path,
    count: int,
    name: str = "redis",
    extra_args: tuple[str, ...] = (),
    flag: str = "--cache redis-cluster",
) -> list[tuple[str, ChildProcess]]:
    """(address, child) per node, not started yet: `<name>-<index>`, each with its log
    beside the others and `extra_args` (e.g. maxmemory) on its command line; `flag` is the
    option named when redis-server is missing."""
    server = shutil.which("redis-server")
    if server is None:
        raise ClusterStartError(f"{flag} needs redis-server on PATH")
    nodes = []
    for index in range(count):
        port = free_port()
        folder = data_dir / f"node-{index}"
        folder.mkdir(parents=True)
        argv = [server, "--bind", HOST, "--port", str(port), "--save", "", "--appendonly", "no"]
        argv += ["--dir", str(folder), "--cluster-enabled", "yes"]
        argv += ["--cluster-port", str(free_port())]  # the bus port, known free
        argv += list(extra_args)
        child = ChildProcess(
            name=f"{name}-{index}", argv=argv, log_path=log_dir / f"{name}-{index}.log"
        )
        nodes.append((f"{HOST}:{port}", child))
    return nodes


def join(addresses: list[str], replicas: int, flag: str = "--cache redis-cluster") -> None:
    """Make one cluster of the started nodes and wait until it says cluster_state:ok."""
    cli = shutil.which("redis-cli")
    if cli is None:
        raise ClusterStartError(f"{flag} needs redis-cli on PATH")

    def answers(address: str, *command: str) -> str:
        host, _, port = address.rpartition(":")
        done = subprocess.run(
            [cli, "-h", host, "-p", port, *command], capture_output=True, text=True, timeout=10
        )
        return done.stdout

    if not wait_until(lambda: all(answers(a, "PING").strip() == "PONG" for a in addresses), 30):
        raise ClusterStartError("redis cluster nodes did not answer PING")
    create = [cli, "--cluster", "create", *addresses, "--cluster-replicas", str(replicas)]
    done = subprocess.run(
        [*create, "--cluster-yes"], capture_output=True, text=True, timeout=JOIN_TIMEOUT_S
    )
    if done.returncode != 0:
        raise ClusterStartError(f"redis-cli --cluster create failed:\n{done.stdout}{done.stderr}")

    def ok() -> bool:
        return all("cluster_state:ok" in answers(a, "CLUSTER", "INFO") for a in addresses)

    if not wait_until(ok, JOIN_TIMEOUT_S, 0.1):
        raise ClusterStartError("redis cluster did not reach cluster_state:ok")
