"""How much CPU grammar work may take from the step loop.

A tenant's near-limit grammar may take a core for its whole compile timeout, and the
compiled grammar, handed back serialised, takes up to a fifth of a second of CPU to
deserialise in the pod's own process. Neither may delay the engine thread (or, on a GPU,
its kernel launches), the pod's gRPC loop or, on one machine, the gateway.

- Compile workers run at nice 10: a contended worker gets about a tenth of a core's share,
  never none: a busy CPU slows a compile down, it does not stop it.
- The pool's slot threads, which deserialise, run under SCHED_IDLE: any other thread that
  wakes takes their core at once. No timeout runs while they work (the request is already
  compiled), so on a CPU busy for good they only start the request later.

On the 2-core CPU machine (bench/hostile_grammar.py, tiny model) the attack's slowdown of
well-behaved requests is then that of a second client's ordinary structured requests, within
the bench's run-to-run noise.
"""

from __future__ import annotations

import contextlib
import os

WORKER_NICENESS = 10


def lower_priority(process_id: int = 0) -> None:
    """Run a process (0: the caller) under the normal policy at WORKER_NICENESS. Its fork
    server is started from a normal thread (workers.start_fork_server); should an idle
    thread have restarted it, a worker leaves the idle policy here, where permitted."""
    with contextlib.suppress(OSError, AttributeError):
        if os.sched_getscheduler(process_id) != os.SCHED_OTHER:
            os.sched_setscheduler(process_id, os.SCHED_OTHER, os.sched_param(0))
    # Refused only when the caller is nicer still (lowering niceness needs privilege):
    # then the compiles keep that lower priority.
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, process_id, WORKER_NICENESS)


def idle_priority(thread_id: int) -> None:
    """Run one thread (its native id, on Linux) only on a core nothing else wants."""
    with contextlib.suppress(OSError, AttributeError):  # no SCHED_IDLE off Linux
        os.sched_setscheduler(thread_id, os.SCHED_IDLE, os.sched_param(0))
