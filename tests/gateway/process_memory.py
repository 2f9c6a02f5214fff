"""Peak resident memory of a process tree during one action, read from /proc (Linux): each
process's peak is reset to its current RSS (`clear_refs` 5), the action runs, and the growth
is the new peak (VmHWM) over the RSS before it."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

MB = 1 << 20


def tree(pid: int) -> list[int]:
    """`pid` and every live descendant of it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found, stack = [], [pid]
    while stack:
        current = stack.pop()
        found.append(current)
        stack.extend(children.get(current, []))
    return found


def maps_library(pid: int, name: str) -> bool:
    """Whether process `pid` has a library whose path holds `name` mapped."""
    return name in Path(f"/proc/{pid}/maps").read_text()


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"/proc/{pid}/status has no {field}")


def peak_growth(pids: list[int], action: Callable[[], object]) -> tuple[dict[int, int], object]:
    """({pid: bytes its peak RSS grew by during `action`}, what `action` returned)."""
    before = {}
    for pid in pids:
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
        before[pid] = _status_kib(pid, "VmRSS")
    result = action()
    growth = {pid: max(0, _status_kib(pid, "VmHWM") - before[pid]) * 1024 for pid in pids}
    return growth, result


def describe(growth: dict[int, int]) -> str:
    return ", ".join(f"{pid}: {size / MB:.1f} MB ({_name(pid)})" for pid, size in growth.items())


def _name(pid: int) -> str:
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "gone"
    text = " ".join(arg.decode(errors="replace") for arg in args if arg)
    return text[-60:] if os.sep in text else text
