"""Child processes stop with their whole group and never outlive a killed parent."""

import os
import signal
import subprocess
import sys
import textwrap

from iris.up.processes import ChildProcess, free_port, wait_until


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); read its state.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_free_port_is_bindable():
    import socket

    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_stop_reaches_grandchildren(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    script = textwrap.dedent(
        f"""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open({str(pid_file)!r}, "w").write(str(child.pid))
        time.sleep(60)
        """
    )
    process = ChildProcess("parent", [sys.executable, "-c", script], log_path=tmp_path / "log")
    process.start()
    assert wait_until(pid_file.exists, 60)
    grandchild = int(pid_file.read_text())
    process.stop(timeout_s=5)
    assert not process.running()
    assert wait_until(lambda: not alive(grandchild), 5)


def test_children_die_with_a_killed_parent(tmp_path):
    # A supervisor that starts a child, then is SIGKILLed: PR_SET_PDEATHSIG ends the child.
    pid_file = tmp_path / "child.pid"
    supervisor = textwrap.dedent(
        f"""
        import sys, time
        from iris.up.processes import ChildProcess
        child = ChildProcess("c", [sys.executable, "-c", "import time; time.sleep(60)"])
        child.start()
        open({str(pid_file)!r}, "w").write(str(child.pid))
        time.sleep(60)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", supervisor], cwd=os.getcwd())
    assert wait_until(pid_file.exists, 60)
    child = int(pid_file.read_text())
    assert alive(child)
    parent.send_signal(signal.SIGKILL)
    parent.wait(5)
    assert wait_until(lambda: not alive(child), 5)


def test_sigterm_ignoring_child_is_killed(tmp_path):
    # The child says when it ignores SIGTERM: a stop sent before that would end it by
    # SIGTERM, however slow the machine is to start Python.
    ignoring = tmp_path / "ignoring"
    script = (
        "import pathlib, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "pathlib.Path(sys.argv[1]).touch(); time.sleep(60)"
    )
    process = ChildProcess("stubborn", [sys.executable, "-c", script, str(ignoring)])
    process.start()
    assert wait_until(ignoring.exists, 60)
    process.stop(timeout_s=1)
    assert not process.running()
    assert process.process.returncode == -signal.SIGKILL
