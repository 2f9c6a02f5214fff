"""Launcher that makes a child die with its parent, then becomes the real command.

`python -m iris.up.child PARENT_PID CMD ARGS...`: asks the kernel (Linux PR_SET_PDEATHSIG)
to SIGTERM this process when its parent dies, checks the parent is still the one that
started it (it may have died before the request), then execs CMD — the setting survives
exec. Doing this after exec rather than in a `preexec_fn` keeps Python code out of the
window between fork and exec, where a parent running gRPC threads is not safe to fork.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> None:
    parent, command = int(argv[0]), argv[1:]
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before the request took effect
        sys.exit(1)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
