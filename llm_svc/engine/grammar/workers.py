"""The pool's side of one compile worker process (its loop: worker.py).

A compile cannot be interrupted inside xgrammar, so it runs in a process of its own, and a
compile that outlives its timeout is ended by killing that process; the slot then gets a
fresh worker. Workers are forked by multiprocessing's fork server, which imports xgrammar
(and torch, which xgrammar imports) once, so a new worker is ready in milliseconds. A
compile's deadline is the caller's to move: it is asked again whenever it comes."""

from __future__ import annotations

import importlib
import logging
import multiprocessing
import multiprocessing.forkserver
import threading
import time
from collections.abc import Callable

from llm_svc.engine.grammar.priority import lower_priority

log = logging.getLogger(__name__)

WORKER_MODULE = "llm_svc.engine.grammar.worker"
START_TIMEOUT_S = 300.0  # the fork server's first start imports torch and xgrammar

_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload([WORKER_MODULE])


def start_fork_server() -> None:
    """Start the fork server now, from the calling thread, whose scheduling policy it and
    every worker inherit: the pool's slot threads run idle (priority.py), workers must not.
    A failure is left to the first worker's start, which reports it per request."""
    try:
        multiprocessing.forkserver.ensure_running()
    except OSError as err:
        log.warning("grammar fork server did not start: %s", err)


class WorkerTimeout(Exception):
    """The worker did not answer in time (it has been killed)."""


class WorkerDied(Exception):
    """The worker exited or broke the protocol (it has been killed)."""


def _run(module: str, conn) -> None:
    lower_priority()  # priority.py
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
            started = time.monotonic()
            self._receive(lambda: started + START_TIMEOUT_S)
            self.ready = True

    def compile(self, kind: str, value: str, deadline: Callable[[], float]) -> dict:
        """The worker's reply to one job; WorkerTimeout / WorkerDied (worker killed). The
        job may run until `deadline()` (time.monotonic()), read again each time it comes,
        so the caller may move it later while the worker compiles."""
        self.wait_ready()
        self._send((kind, value))
        return self._receive(deadline)

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

    def _receive(self, deadline: Callable[[], float]) -> dict:
        try:
            while not self._conn.poll(max(0.0, deadline() - time.monotonic())):
                if time.monotonic() >= deadline():
                    self.kill()
                    raise WorkerTimeout("no answer before the deadline")
            reply = self._conn.recv()
        except (EOFError, OSError) as err:
            self.kill()
            raise WorkerDied(f"compile worker {self.pid} exited ({err})") from None
        if not isinstance(reply, dict):
            self.kill()
            raise WorkerDied(f"compile worker {self.pid} sent a malformed answer")
        return reply
