"""The pool's side of one compile worker process (its loop: worker.py).

A compile cannot be interrupted inside xgrammar, so it runs in a process of its own, and a
compile that outlives its timeout is ended by killing that process; the slot then gets a
fresh worker. Workers are forked by multiprocessing's fork server, which imports xgrammar
(and torch, which xgrammar imports) once, so a new worker is ready in milliseconds. The
timeout counts from when the job is sent to a ready worker."""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing
import os
import threading

WORKER_MODULE = "llm_svc.engine.grammar.worker"
START_TIMEOUT_S = 300.0  # the fork server's first start imports torch and xgrammar
# Compiles yield the CPU to the step loop: a tenant's large grammar may take a core for its
# whole timeout, but the engine thread (and on a GPU, its kernel launches) must not wait
# behind it. At nice 10 a contended worker gets about a tenth of a core's share. The pool's
# slot threads, which deserialise the compiled grammar in the pod's own process (up to a
# fifth of a second of CPU for a near-limit one), run at the same niceness.
WORKER_NICENESS = 10

_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload([WORKER_MODULE])


class WorkerTimeout(Exception):
    """The worker did not answer in time (it has been killed)."""


class WorkerDied(Exception):
    """The worker exited or broke the protocol (it has been killed)."""


def lower_priority(thread_id: int = 0) -> None:
    """Set a process's, or on Linux one thread's, niceness to WORKER_NICENESS (0: the
    caller's process; a thread's native id: that thread alone)."""
    # Refused only when the caller is nicer still (lowering niceness needs privilege):
    # then the compiles keep that lower priority.
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, thread_id, WORKER_NICENESS)


def _run(module: str, conn) -> None:
    lower_priority()
    importlib.import_module(module).serve(conn)


class CompileWorker:
    """One worker process, started and sent its tokenizer at once; ready once it answers,
    which `compile` waits for first. `module` has a `serve(conn)` (worker.py's)."""

    def __init__(self, tokenizer_info_json: str, module: str = WORKER_MODULE) -> None:
        self._conn, child = _CONTEXT.Pipe()
        self.process = _CONTEXT.Process(target=_run, args=(module, child), daemon=True)
        self.process.start()
        child.close()
        self.ready = False
        # A pool closing while a spare is being made may kill a worker from two threads.
        self._kill_lock = threading.Lock()
        self._killed = False
        self._send(tokenizer_info_json)

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait_ready(self) -> None:
        """Wait for the worker's start (the fork server's first start imports torch)."""
        if not self.ready:
            self._receive(START_TIMEOUT_S)
            self.ready = True

    def compile(self, kind: str, value: str, timeout_s: float) -> dict:
        """The worker's reply to one job; WorkerTimeout / WorkerDied (worker killed)."""
        self.wait_ready()
        self._send((kind, value))
        return self._receive(timeout_s)

    def kill(self) -> None:
        """End the worker and close its pipe (once, whichever thread asks first)."""
        with self._kill_lock:
            if self._killed:
                return
            self._killed = True
            if self.process.is_alive():
                self.process.kill()
            self.process.join()
            self._conn.close()

    def _send(self, message) -> None:
        try:
            self._conn.send(message)
        except (OSError, ValueError) as err:
            self.kill()
            raise WorkerDied(f"compile worker {self.pid} exited ({err})") from None

    def _receive(self, timeout_s: float) -> dict:
        try:
            if not self._conn.poll(timeout_s):
                self.kill()
                raise WorkerTimeout(f"no answer within {timeout_s:g} s")
            reply = self._conn.recv()
        except (EOFError, OSError) as err:
            self.kill()
            raise WorkerDied(f"compile worker {self.pid} exited ({err})") from None
        if not isinstance(reply, dict):
            self.kill()
            raise WorkerDied(f"compile worker {self.pid} sent a malformed answer")
        return reply
