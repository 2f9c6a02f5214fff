"""Child processes that never outlive their parent.

Each child runs in its own session and process group (so a stop reaches its own children
too) and, on Linux, is SIGTERMed by the kernel if the parent dies first (PR_SET_PDEATHSIG,
set by the `iris.up.child` launcher) — a `kill -9` of `iris up` leaves no orphans.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

_handed_out: set[int] = set()
# Ports handed out by any process on this machine in the last PORT_HOLD_S seconds (a
# file under a lock): two platforms started at once must not be given the same port.
_REGISTRY = Path(tempfile.gettempdir()) / "iris-ports"
PORT_HOLD_S = 600.0


def _port_range() -> tuple[int, int]:
    """Ports to hand out: below the kernel's ephemeral range, which bind(0) and every
    outgoing connection draw from (a connection could take a port between our check and
    the service's bind); the ephemeral range itself if too little lies below it."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    if low - 20000 >= 4000:
        return 20000, low - 1
    return 0, 0  # bind(0): the kernel's choice


def _is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on `host` right now and not handed out recently by any
    process on this machine (services started together, or by two platforms at once,
    must not be given the same one), from outside the ephemeral range where possible."""
    low, high = _port_range()
    with open(_REGISTRY, "a+") as registry:
        fcntl.flock(registry, fcntl.LOCK_EX)
        registry.seek(0)
        now = time.time()
        held = {}
        for line in registry.read().split():
            port, _, when = line.partition("@")
            with contextlib.suppress(ValueError):
                if now - float(when) < PORT_HOLD_S:
                    held[int(port)] = float(when)
        port = _pick(host, low, high, held.keys() | _handed_out)
        held[port] = now
        registry.seek(0)
        registry.truncate()
        registry.write(" ".join(f"{p}@{when:.0f}" for p, when in held.items()))
    _handed_out.add(port)
    return port


def _pick(host: str, low: int, high: int, taken) -> int:
    for _ in range(200):
        if high:
            port = random.randint(low, high)
            if port not in taken and _is_free(host, port):
                return port
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = sock.getsockname()[1]
        if port not in taken:
            return port
    raise RuntimeError("no fresh free port found in 200 tries")


@dataclass
class ChildProcess:
    """One service process: its command line, environment and log file."""

    name: str
    argv: Sequence[str]
    env: dict[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    process: subprocess.Popen | None = None

    def start(self) -> None:
        env = {**os.environ, **self.env}
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        # A new session is a new process group; the launcher (iris.up.child) arranges for
        # the child to die with us. No preexec_fn: no Python may run between fork and exec
        # in a parent with gRPC threads (it aborted children with "epoll_wait error").
        launcher = [sys.executable, "-m", "iris.up.child", str(os.getpid())]
        self.process = subprocess.Popen(
            [*launcher, *self.argv],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        if log is not subprocess.DEVNULL:
            log.close()  # the child holds its own descriptor

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal_group(self, signum: int) -> None:
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signum)

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM the process group, then SIGKILL after `timeout_s`; return the exit code."""
        if self.process is None:
            return None
        if self.running():
            self.signal_group(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.signal_group(signal.SIGKILL)
                self.process.wait(5)
        # Whatever the leader left in its group goes too.
        self.signal_group(signal.SIGKILL)
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL the whole group at once (fault tests)."""
        self.signal_group(signal.SIGKILL)
        if self.process is not None:
            self.process.wait(5)

    def tail(self, lines: int = 30) -> str:
        if not self.log_path or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def wait_until(predicate, timeout_s: float, interval_s: float = 0.1) -> bool:
    """Poll `predicate` until it is true or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return bool(predicate())
