"""Suite-wide pytest setup. Shared fixtures live in tests/fixtures/, one module per concern."""

import contextlib
import ctypes
import os
import sys
import time
from pathlib import Path

import pytest

# Nothing in the test suite may reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The suite forks service processes while its own gRPC servers and channels are running;
# gRPC's fork handlers must stay out of that (see iris/service_main.py).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

pytest_plugins = [
    "tests.fixtures.models",
    "tests.fixtures.redis_server",
    "tests.fixtures.redis_cluster",
    "tests.fixtures.otlp_collector",
    "tests.fixtures.platform",
    "tests.fixtures.certs",
    "tests.fixtures.thinking",
]

PR_SET_CHILD_SUBREAPER = 36
STRAGGLER_WAIT_S = 10.0  # a child stopped in the last teardown may still be exiting


def pytest_sessionstart(session: pytest.Session) -> None:
    """On Linux the test process adopts every orphaned descendant (a child subreaper), so a
    process that outlived its parent (a killed service's worker pool) is still seen below
    it when the session ends."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _own_helpers() -> set[int]:
    """multiprocessing's resource tracker and fork server of this process, if started: one
    each per interpreter, they end when it does (their children are still looked at)."""
    from multiprocessing import forkserver, resource_tracker

    pids = {
        getattr(resource_tracker._resource_tracker, "_pid", None),
        getattr(forkserver._forkserver, "_forkserver_pid", None),
    }
    return pids - {None}


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(child) for child in (task / "children").read_text().split()]
        except OSError:  # the task ended meanwhile
            continue
    return found


def running_descendants(pid: int) -> dict[int, str]:
    """{pid: command line} of every live process below `pid` (zombies and this process's
    multiprocessing helpers left out), read from /proc."""
    helpers, left, stack = _own_helpers(), {}, [pid]
    while stack:
        for child in _children(stack.pop()):
            try:
                state = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0]
                command = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            stack.append(child)
            if state != "Z" and child not in helpers:
                left[child] = command.decode(errors="replace").strip()
    return left


def _reap_adopted() -> None:
    """Collect the exit status of every child that has ended (adopted orphans included)."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run when a test left a child process running (a pool not shut down, a
    service not stopped): every fixture has been torn down by now. Under pytest-xdist each
    worker checks its own children, and the controller runs this last, after its workers
    were shut down (so they are not counted)."""
    if not Path("/proc/self/task").exists():
        return  # not Linux: no /proc to read
    deadline = time.monotonic() + STRAGGLER_WAIT_S
    while (left := running_descendants(os.getpid())) and time.monotonic() < deadline:
        time.sleep(0.2)
    _reap_adopted()
    if not left:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = ["", f"child processes left running after the session ({len(left)}):"]
    lines += [f"  {pid}: {command[:200]}" for pid, command in sorted(left.items())]
    if reporter is not None:
        reporter.write_line("\n".join(lines), red=True, bold=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
