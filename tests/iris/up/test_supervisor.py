"""The supervisor restarts exited services with backoff and gives up on a crash loop, on
real child processes; time is a clock the test moves, so nothing waits on the machine."""

from __future__ import annotations

import signal
import sys

import pytest

from iris.up.platform import Service
from iris.up.processes import ChildProcess, wait_until
from iris.up.supervisor import RestartPolicy, Supervisor

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]
CRASHER = [sys.executable, "-c", "raise SystemExit(3)"]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def service(tmp_path, name: str, argv) -> Service:
    child = ChildProcess(name, argv, log_path=tmp_path / f"{name}.log")
    return Service(name, "encoder", child, "127.0.0.1:1", None)


@pytest.fixture
def sleeper(tmp_path):
    running = service(tmp_path, "encoder-0", SLEEPER)
    running.child.start()
    yield running
    running.child.stop(timeout_s=5)


def test_backoff_doubles_up_to_its_cap():
    policy = RestartPolicy(initial_s=1.0, max_s=10.0)
    assert [policy.delay_s(n) for n in range(6)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_an_exited_service_is_restarted_after_its_backoff_and_reported(sleeper):
    clock, reports, healthy = Clock(), [], {"answer": False}
    supervisor = Supervisor(
        [sleeper], lambda _: healthy["answer"], reports.append, RestartPolicy(), clock
    )
    first_pid = sleeper.child.pid
    sleeper.child.signal_group(signal.SIGKILL)
    sleeper.child.process.wait(10)
    supervisor.tick()
    assert "encoder-0 exited with code -9" in reports[-1]
    assert (
        str(sleeper.child.log_path) in reports[-1]
        and "restarting encoder-0 in 1.0 s" in reports[-1]
    )
    clock.now += 0.5
    supervisor.tick()
    assert not sleeper.child.running() and supervisor.pending() == ["encoder-0"]
    clock.now += 0.5
    supervisor.tick()
    assert sleeper.child.running() and sleeper.child.pid != first_pid
    assert "restarted encoder-0" in reports[-1] and str(sleeper.child.log_path) in reports[-1]
    supervisor.tick()  # not healthy yet: nothing said
    assert "serves again" not in reports[-1]
    healthy["answer"] = True
    clock.now += 2.0
    supervisor.tick()
    assert reports[-1] == "encoder-0 serves again, 2.0 s after its restart"
    # A second exit soon after waits twice as long.
    sleeper.child.signal_group(signal.SIGKILL)
    sleeper.child.process.wait(10)
    supervisor.tick()
    assert "restarting encoder-0 in 2.0 s" in reports[-1]


def test_a_crash_loop_is_given_up_and_the_others_serve_on(tmp_path, sleeper):
    crasher = service(tmp_path, "llm-1", CRASHER)
    crasher.child.start()
    clock, reports = Clock(), []
    policy = RestartPolicy(initial_s=1.0, max_s=4.0, crash_loop_restarts=5, crash_loop_window_s=60)
    supervisor = Supervisor([crasher, sleeper], lambda _: False, reports.append, policy, clock)
    restarts = 0
    while "llm-1" not in supervisor.given_up:
        assert wait_until(lambda: not crasher.child.running(), 30)
        supervisor.tick()
        if supervisor.pending():
            clock.now += policy.max_s
            supervisor.tick()
            restarts += 1
        assert restarts <= 5, reports
    assert restarts == 5
    assert "crash loop (5 restarts in 60 s): given up" in reports[-1]
    assert "llm-1 exited with code 3" in reports[-1]
    clock.now += 100
    supervisor.tick()  # given up stays given up
    assert not crasher.child.running() and sleeper.child.running()
    assert supervisor.pending() == []


def test_restarts_older_than_the_window_do_not_count(tmp_path):
    crasher = service(tmp_path, "cache", CRASHER)
    crasher.child.start()
    clock, reports = Clock(), []
    policy = RestartPolicy(initial_s=1.0, crash_loop_restarts=2, crash_loop_window_s=60)
    supervisor = Supervisor([crasher], lambda _: False, reports.append, policy, clock)
    for _ in range(6):  # one crash a minute is no loop
        assert wait_until(lambda: not crasher.child.running(), 30)
        supervisor.tick()
        assert "restarting cache in 1.0 s" in reports[-1], reports
        clock.now += 1
        supervisor.tick()
        assert "restarted cache" in reports[-1]
        clock.now += 61  # it ran a minute before crashing again
    assert supervisor.given_up == set()
