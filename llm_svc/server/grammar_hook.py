"""The test hook that swaps a pod's grammar compile worker for another module.

Tests need a compile that never ends, whatever the machine's speed, to show a worker killed
at the compile timeout in a real pod (tests/llm_svc/stalling_grammar_worker.py). Like the
step-fault hook (step_failures.py), `IRIS_TEST_GRAMMAR_WORKER` is read only when
`IRIS_TEST_HOOKS=1` is set, a flag no deployment sets; without it the variable is ignored.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from llm_svc.engine.config import EngineConfig
from llm_svc.server.step_failures import TEST_HOOKS_FLAG

log = logging.getLogger(__name__)

GRAMMAR_WORKER_VAR = "IRIS_TEST_GRAMMAR_WORKER"
DEFAULT_WORKER_MODULE = EngineConfig.grammar_worker_module


def grammar_worker_from_env(environ: Mapping[str, str] = os.environ) -> str:
    """The compile worker module the pod runs: the hook's, or the real one."""
    module = environ.get(GRAMMAR_WORKER_VAR, "")
    if not module:
        return DEFAULT_WORKER_MODULE
    if environ.get(TEST_HOOKS_FLAG) != "1":
        log.warning("%s is ignored: %s is not set", GRAMMAR_WORKER_VAR, TEST_HOOKS_FLAG)
        return DEFAULT_WORKER_MODULE
    log.warning("TEST HOOK: grammar compile workers run %s (%s)", module, GRAMMAR_WORKER_VAR)
    return module
