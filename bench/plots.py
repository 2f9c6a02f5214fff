"""What every benchmark draws: matplotlib PNGs in bench/out/, each stamped with what was run.

`stamp` writes the command line, the model and the cores the run had on the figure's face,
so a copy of the PNG stands alone. `figure` and `save` are the common start and end of every
benchmark's plot; the plots themselves live beside the figures each benchmark prints.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import shlex
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out"


def cores() -> int:
    """The CPU cores this process may run on (its affinity), not the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def command_line() -> str:
    """How this benchmark was started, as one would type it again."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name:  # python -m bench.x
        return shlex.join(["python", "-m", spec.name, *sys.argv[1:]])
    script = Path(sys.argv[0])
    with contextlib.suppress(ValueError):  # run from outside the checkout: keep it as given
        script = script.resolve().relative_to(Path(__file__).resolve().parents[1])
    return shlex.join(["python", str(script), *sys.argv[1:]])


def figure(rows: int = 1, cols: int = 1, size: tuple[float, float] = (8.0, 4.5)):
    """A matplotlib figure and its axes, drawn off-screen."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(rows, cols, figsize=size, squeeze=False)


def stamp(fig, model: str | Path | None, extra: str = "") -> None:
    """Write the command, the model, the cores and the date at the figure's foot."""
    model_text = Path(model).name if model else "-"
    today = datetime.date.today().isoformat()
    lines = [
        f"$ {command_line()}",
        f"model: {model_text} · cores: {cores()} · {today}" + (f" · {extra}" if extra else ""),
    ]
    fig.text(0.01, 0.005, "\n".join(lines), fontsize=7, family="monospace", va="bottom")
    fig.subplots_adjust(bottom=0.2)


def save(fig, name: str | Path) -> Path:
    """Save under bench/out/ (a bare name) or at `name` (a path); returns where."""
    import matplotlib.pyplot as plt

    path = Path(name) if Path(name).parent != Path(".") else OUT / name
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
