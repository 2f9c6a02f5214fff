"""Restart the services of a running platform the way Kubernetes restarts a container.

A service that exits after the platform is up is started again, with the same command,
environment and ports (so its peers find it where they left it), after an exponential
backoff: `initial_s`, then twice that, up to `max_s`; what the exited process left in its
process group is killed first. A service restarted `crash_loop_restarts` times within
`crash_loop_window_s` that exits again is in a crash loop: it is given up (reported, left
stopped) and the platform serves on with what is left. Each step is reported through
`report` with the service's log path.

The supervisor does nothing on its own thread: `tick()` does one pass (the caller's loop,
`iris up`'s main thread, calls it), so stopping the loop stops every restart not yet begun,
and a restart already begun is an ordinary child process that `Platform.stop()` ends.
"""

from __future__ import annotations

import signal
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from iris.up.platform import Service


@dataclass(frozen=True)
class RestartPolicy:
    """When to restart and when to stop trying (Kubernetes: 10 s doubling to 5 min; a local
    platform comes back sooner)."""

    initial_s: float = 1.0
    max_s: float = 30.0
    crash_loop_restarts: int = 5
    crash_loop_window_s: float = 60.0

    def delay_s(self, recent_restarts: int) -> float:
        return min(self.max_s, self.initial_s * 2**recent_restarts)


@dataclass
class _State:
    restarts: deque = field(default_factory=deque)  # monotonic times of recent restarts
    due: float | None = None  # a restart is scheduled for this time
    back_since: float | None = None  # restarted at this time, not yet healthy


class Supervisor:
    """Watches `services`; `healthy(service)` says whether a restarted one serves again."""

    def __init__(
        self,
        services: Sequence[Service],
        healthy: Callable[[Service], bool],
        report: Callable[[str], None],
        policy: RestartPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.services = services
        self.healthy = healthy
        self.report = report
        self.policy = policy or RestartPolicy()
        self.clock = clock
        self.given_up: set[str] = set()
        self._states: dict[str, _State] = {}

    def tick(self) -> None:
        """Notice exits, schedule their restarts, start the restarts that are due, and say
        when a restarted service is healthy again."""
        now = self.clock()
        for service in self.services:
            if service.name in self.given_up:
                continue
            state = self._states.setdefault(service.name, _State())
            if state.due is not None:
                if now >= state.due:
                    self._restart(service, state, now)
                continue
            if service.exited():
                # As Kubernetes ends a container whose main process exited: whatever the
                # service started in its process group (a worker pool) ends with it, or a
                # killed gateway's pool would outlive it, idle, for good.
                service.child.signal_group(signal.SIGKILL)
                self._schedule(service, state, now)
            elif state.back_since is not None and self.healthy(service):
                self.report(
                    f"{service.name} serves again, {now - state.back_since:.1f} s after its restart"
                )
                state.back_since = None

    def run(self, stop, interval_s: float = 0.2) -> None:
        """`tick()` until the threading.Event `stop` is set."""
        while not stop.wait(interval_s):
            self.tick()

    def pending(self) -> list[str]:
        """Services with a restart scheduled and not yet begun."""
        return [name for name, state in self._states.items() if state.due is not None]

    def _schedule(self, service: Service, state: _State, now: float) -> None:
        window = self.policy.crash_loop_window_s
        while state.restarts and now - state.restarts[0] > window:
            state.restarts.popleft()
        state.back_since = None
        if len(state.restarts) >= self.policy.crash_loop_restarts:
            self.given_up.add(service.name)
            self.report(
                f"{service.describe_exit()}\n{service.name} is in a crash loop "
                f"({len(state.restarts)} restarts in {window:.0f} s): given up, the platform "
                f"serves on without it"
            )
            return
        delay = self.policy.delay_s(len(state.restarts))
        state.due = now + delay
        self.report(f"{service.describe_exit()}\nrestarting {service.name} in {delay:.1f} s")

    def _restart(self, service: Service, state: _State, now: float) -> None:
        state.due = None
        state.restarts.append(now)
        state.back_since = now
        try:
            service.child.start()
        except OSError as err:  # e.g. the executable vanished: counts as an exit
            self.report(f"{service.name} could not be restarted: {err}")
            return
        self.report(
            f"restarted {service.name} (pid {service.child.pid}, restart "
            f"{len(state.restarts)} in {self.policy.crash_loop_window_s:.0f} s); its log: "
            f"{service.child.log_path}"
        )
