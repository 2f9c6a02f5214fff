"""Backend choice shared by every kernel: Triton for CUDA tensors, the torch twin otherwise.

`backend="triton"` forces the Triton kernel (on a CPU tensor only under `TRITON_INTERPRET=1`,
which the caller sets before anything launches); `backend="torch"` forces the twin. Every
launch is counted in `CALLS[(kernel_name, backend)]`, so tests can assert which path ran.
"""

from __future__ import annotations

import functools
import types
from collections import Counter
from typing import Literal

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

Backend = Literal["triton", "torch"]
BACKENDS: tuple[Backend, ...] = ("triton", "torch")

# (kernel name, backend) -> launches since import; read-only for callers.
CALLS: Counter[tuple[str, str]] = Counter()


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return bool(triton.knobs.runtime.interpret)


def resolve_backend(kernel: str, backend: str | None, device: torch.device) -> Backend:
    """Pick the path for one launch of `kernel` on `device` and count it.

    Raises ValueError for an unknown backend name, or for Triton on a non-CUDA device while
    the interpreter is off (Triton has no CPU driver).
    """
    if backend is None:
        chosen: Backend = "triton" if device.type == "cuda" else "torch"
    elif backend in BACKENDS:
        chosen = backend  # type: ignore[assignment]
    else:
        raise ValueError(f"backend {backend!r} unknown; expected one of {BACKENDS} or None")
    if chosen == "triton" and device.type != "cuda" and not interpreting():
        raise ValueError(
            f"backend='triton' on a {device.type} tensor needs TRITON_INTERPRET=1 "
            "set before the first launch"
        )
    CALLS[(kernel, chosen)] += 1
    return chosen


class _PerMode:
    """Triton code built once per interpreter mode, with its combiners and helpers bound.

    Building at first use rather than at import means a process that imported `iris_kernels`
    before setting TRITON_INTERPRET (a test suite, a notebook) still gets the mode in force
    when it launches, and a GPU test can switch the interpreter off to run the compiled
    kernel. For that to hold, bodies call only Triton builtins (tl.load, tl.reduce, tl.full,
    ...), never triton's own jit helpers (tl.sum, tl.max, tl.zeros, tl.cdiv): those are
    fixed to the mode in force when triton was imported. A sum or a max uses `tl.reduce`
    with a combiner bound per mode (`sum_combine=NAME, max_combine=NAME`), and a call to
    one of this package's `device_function`s reaches that function's build for the same
    mode: any global of the body that holds a `DeviceFunction` is rebound to it.
    """

    def __init__(self, fn, sum_combine: str | None, max_combine: str | None):
        self.fn = fn
        self.combiners = {
            name: pick
            for name, pick in ((sum_combine, _sum_combiner), (max_combine, _max_combiner))
            if name
        }
        self._by_mode: dict[bool, object] = {}
        functools.update_wrapper(self, fn)

    def build(self, mode: bool):
        """The code for one mode, interpreted (True) or compiled (False); built once each."""
        built = self._by_mode.get(mode)
        if built is None:
            built = self._by_mode[mode] = self._wrap(self._bind(mode), mode)
        return built

    def _wrap(self, fn, mode: bool):
        raise NotImplementedError

    def _bind(self, mode: bool):
        """`fn` under a copy of its globals in which combiners and helpers fit `mode`."""
        fn = self.fn
        bound = {name: pick(mode) for name, pick in self.combiners.items()}
        for name in fn.__code__.co_names:
            helper = fn.__globals__.get(name)
            if isinstance(helper, DeviceFunction):
                bound[name] = helper.build(mode)
        if not bound:
            return fn
        scope = {**fn.__globals__, **bound}
        copy = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__)
        # Annotations mark the tl.constexpr parameters; a bare copy would lose them.
        copy.__annotations__ = dict(fn.__annotations__)
        copy.__module__, copy.__qualname__ = fn.__module__, fn.__qualname__
        return copy


class _LazyKernel(_PerMode):
    """A kernel used in place of a `triton.jit` one: `kernel[grid](...)` launches the build
    for the mode in force at that launch."""

    def _wrap(self, fn, mode: bool):
        # What triton.jit returns in each mode, chosen by `mode` rather than the environment.
        return InterpretedFunction(fn) if mode else triton.runtime.JITFunction(fn)

    def __getitem__(self, grid):
        return self.build(interpreting())[grid]


class DeviceFunction(_PerMode):
    """A function that kernels of this package call on the device (see `device_function`).

    It is never called itself: a kernel's build puts the build of the same mode in its place.
    """

    def _wrap(self, fn, mode: bool):
        if not mode:
            # A JITFunction called from a kernel's JITFunction is compiled into the kernel.
            return triton.runtime.JITFunction(fn)
        # Interpreted, the kernel's launch has patched triton.language for the whole grid,
        # so the helper is the interpreter's rewrite of it (the Python function it would run)
        # called directly. An InterpretedFunction would patch the language again at every
        # call (~0.6 ms, for each tile of each program).
        return InterpretedFunction(fn).rewrite()


def jit(fn=None, *, sum_combine: str | None = None, max_combine: str | None = None):
    """Decorator used in place of `triton.jit` for the kernels of this package.

    `sum_combine="NAME"` makes the global NAME, inside the kernel, a `tl.reduce` combine
    function for a sum that works in the mode the kernel is built in; `max_combine` the
    same for a maximum. Device functions the kernel calls are bound for that mode too.
    """
    if fn is None:
        return functools.partial(jit, sum_combine=sum_combine, max_combine=max_combine)
    return _LazyKernel(fn, sum_combine, max_combine)


def device_function(fn=None, *, sum_combine: str | None = None, max_combine: str | None = None):
    """Decorator used in place of `triton.jit` for a function that kernels call.

    A kernel (`jit`) or another device function that calls it by its global name gets, in
    each mode, the function built for that mode: a JITFunction that the compiler inlines
    when compiled, the interpreter's Python function when interpreted. `sum_combine` and
    `max_combine` bind combiners inside it as for `jit`.
    """
    if fn is None:
        return functools.partial(device_function, sum_combine=sum_combine, max_combine=max_combine)
    return DeviceFunction(fn, sum_combine, max_combine)


def _add(a, b):
    return a + b


@functools.cache
def _compiled_add() -> triton.runtime.JITFunction:
    return triton.runtime.JITFunction(_add)


def _max(a, b):
    return tl.maximum(a, b)


@functools.cache
def _compiled_max() -> triton.runtime.JITFunction:
    return triton.runtime.JITFunction(_max)


def _max_combiner(interpreted: bool):
    # As for the sum: the interpreter reduces triton's own max combiner with one numpy call.
    return tl.standard._elementwise_max if interpreted else _compiled_max()


def _sum_combiner(interpreted: bool):
    # Interpreted: triton's own sum combiner, which the interpreter recognises and reduces
    # with one numpy call (any other combiner runs per element, ~0.3 s per 2048 values).
    # Compiled: our own jit function, since triton's may be an interpreter object when
    # triton was imported under TRITON_INTERPRET.
    return tl.standard._sum_combine if interpreted else _compiled_add()
