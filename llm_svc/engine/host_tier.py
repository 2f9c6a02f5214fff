"""The host tier: pages the device pools let go, kept in host memory and copied back on a
hit instead of prefilling again (docs/design/engine.md, "KV tiers").

Three kinds of unit, each a pool of host slots mirroring a device pool:
  - PAGE: a full-attention page (every full layer's K and V for `page_size` tokens);
  - WINDOW: a sliding-window page, the sliding layers' K and V for the same tokens;
  - STATE: a hybrid model's state snapshot (every linear layer's conv and recurrent state).
Which node holds which slot is the radix cache's business (llm_svc/engine/radix_cache.py);
this file owns the host buffers, the free slots and the copies.

The byte budget (`IRIS_LLM_HOST_KV_BYTES`) is split between the kinds as the device
budget is: each pool gets `budget / device bytes` times its device pool's slots, so the
tier is a scaled copy of the device pools. A kind whose unit holds no bytes (the full
pool of a model whose every layer slides) gets as many slots as the tier has units of the
other kinds: its slots only name nodes.

Copies: on the CPU a plain copy, done when the cache decides it. On CUDA the host buffers
are pinned and the copies run on a stream of their own, after the work already queued on
the compute stream (which may still be writing a page that is leaving); `before_step`
makes the compute stream wait for them, so a step never reads a page whose copy is under
way nor overwrites one being saved.

Tensor parallelism: every rank holds its own heads' share of each unit, with the same slot
numbers. Rank 0 journals every copy (`journal`: the list the runner shares with the state
pool, so the order of state copies and tier copies is kept) and the step channel carries
it to the other ranks, which `replay` it before the step that follows.

A load can fail (on CUDA, a copy error; in tests, `fail_loads`): LoadFailedError, and the
cache drops the unit and its tokens are prefilled; a unit whose copy failed is never served.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from iris.rates import Rate
from llm_svc.engine.attention import KVCache
from llm_svc.engine.state_pool import StatePool

PAGE, WINDOW, STATE = "page", "window", "state"
KINDS = (PAGE, WINDOW, STATE)
# Journal entry kinds (the state pool's RESET and COPY are 0 and 1): (kind, source, target).
SAVE = {PAGE: 10, WINDOW: 11, STATE: 12}
LOAD = {PAGE: 13, WINDOW: 14, STATE: 15}
_BY_CODE = {code: (kind, True) for kind, code in SAVE.items()}
_BY_CODE.update({code: (kind, False) for kind, code in LOAD.items()})


class LoadFailedError(RuntimeError):
    """A unit could not be copied back to the device: its tokens are prefilled instead."""


@dataclass
class TierStats:
    """Counters since start (read by the pod's metrics; engine thread only)."""

    # Full pages of admitted prompts' resumable prefixes, by where they were: on the device,
    # in host memory (loaded back), or nowhere (prefilled). Counted once per sequence.
    page_lookups: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(("device", "host", "miss"), 0)
    )
    # Units copied back (hits), and units host memory held that could not be (misses: no
    # device room, or a failed copy), by kind.
    hits: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    misses: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    bytes_to_host: int = 0
    bytes_to_device: int = 0
    load_failures: int = 0
    dropped_full: int = 0  # units the tier had no room for (the device let them go)
    host_hit_tokens: int = 0  # prompt tokens admitted from the host tier
    load_seconds: list[float] = field(default_factory=list)  # per request, drained by metrics
    load_rate: Rate = field(default_factory=Rate)  # bytes per second copied back to the device


def host_memory_left() -> int:
    """Bytes this process may still take: the smaller of the machine's available memory
    and what its cgroup's limit leaves."""
    left = _meminfo_available()
    limit = _read_int("/sys/fs/cgroup/memory.max")
    usage = _read_int("/sys/fs/cgroup/memory.current")
    if limit is not None and usage is not None:
        left = min(left, max(0, limit - usage))
    return left


def _meminfo_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


class _Pages:
    """Host copies of one KVCache's pages."""

    def __init__(self, device: KVCache, slots: int, pin: bool) -> None:
        layers, _, heads, dim = device.k.shape
        size = device.page_size
        self.device_k = device.k.view(layers, -1, size, heads, dim)
        self.device_v = device.v.view(layers, -1, size, heads, dim)
        shape = (layers, slots, size, heads, dim)
        self.k = torch.empty(shape, dtype=device.k.dtype, pin_memory=pin)
        self.v = torch.empty(shape, dtype=device.v.dtype, pin_memory=pin)

    def device_bytes(self, page: int) -> bytes:
        """Device `page`'s K then V, as bytes (the store's payload)."""
        k, v = self.device_k[:, page].reshape(-1), self.device_v[:, page].reshape(-1)
        return _as_bytes(torch.cat([k, v]))

    def fill(self, slot: int, payload: bytes) -> None:
        """Host `slot` from a store payload (`device_bytes`'s layout)."""
        flat = torch.frombuffer(bytearray(payload), dtype=self.k.dtype)
        half = flat.numel() // 2
        self.k[:, slot].copy_(flat[:half].view(self.k[:, slot].shape))
        self.v[:, slot].copy_(flat[half:].view(self.v[:, slot].shape))

    def save(self, page: int, slot: int) -> None:
        self.k[:, slot].copy_(self.device_k[:, page], non_blocking=True)
        self.v[:, slot].copy_(self.device_v[:, page], non_blocking=True)

    def load(self, slot: int, page: int) -> None:
        self.device_k[:, page].copy_(self.k[:, slot], non_blocking=True)
        self.device_v[:, page].copy_(self.v[:, slot], non_blocking=True)


class _States:
    """Host copies of a state pool's slots."""

    def __init__(self, pool: StatePool, slots: int, pin: bool) -> None:
        self.pool = pool
        conv, recurrent = pool.conv[:, 0], pool.recurrent[:, 0]
        self.conv = torch.empty((slots, *conv.shape), dtype=conv.dtype, pin_memory=pin)
        self.recurrent = torch.empty(
            (slots, *recurrent.shape), dtype=recurrent.dtype, pin_memory=pin
        )

    def device_bytes(self, device_slot: int) -> bytes:
        conv = self.pool.conv[:, device_slot].reshape(-1)
        recurrent = self.pool.recurrent[:, device_slot].reshape(-1)
        return _as_bytes(torch.cat([conv, recurrent]))

    def fill(self, slot: int, payload: bytes) -> None:
        flat = torch.frombuffer(bytearray(payload), dtype=self.conv.dtype)
        count = self.conv[slot].numel()
        self.conv[slot].copy_(flat[:count].view(self.conv[slot].shape))
        self.recurrent[slot].copy_(flat[count:].view(self.recurrent[slot].shape))

    def save(self, device_slot: int, slot: int) -> None:
        self.conv[slot].copy_(self.pool.conv[:, device_slot], non_blocking=True)
        self.recurrent[slot].copy_(self.pool.recurrent[:, device_slot], non_blocking=True)

    def load(self, slot: int, device_slot: int) -> None:
        self.pool.conv[:, device_slot].copy_(self.conv[slot], non_blocking=True)
        self.pool.recurrent[:, device_slot].copy_(self.recurrent[slot], non_blocking=True)


def _as_bytes(values: torch.Tensor) -> bytes:
    return values.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()


def _page_bytes(cache: KVCache) -> int:
    """Bytes of one page of `cache` (K and V, every layer)."""
    return 2 * cache.k.numel() * cache.k.element_size() // max(1, cache.num_pages)


def _slot_bytes(pool: StatePool) -> int:
    """Bytes of one state slot of `pool` (conv and recurrent, every layer)."""
    slots = pool.conv.shape[1]
    total = pool.conv.numel() * pool.conv.element_size()
    return (total + pool.recurrent.numel() * pool.recurrent.element_size()) // slots


@dataclass(frozen=True)
class TierSizing:
    """Host slots per kind for a byte budget (see the module docstring)."""

    slots: dict[str, int]
    unit_bytes: dict[str, int]

    @property
    def total_bytes(self) -> int:
        return sum(self.slots[kind] * self.unit_bytes[kind] for kind in KINDS)


def size_tier(budget: int, device_slots: dict[str, int], unit_bytes: dict[str, int]) -> TierSizing:
    """Each kind's host slots: its device slots scaled by budget / device bytes. ValueError
    naming the budget if it holds not one unit of some kind the device has."""
    device_bytes = sum(device_slots[kind] * unit_bytes[kind] for kind in KINDS)
    slots = {}
    for kind in KINDS:
        if not device_slots[kind] or not unit_bytes[kind]:
            slots[kind] = 0
            continue
        slots[kind] = device_slots[kind] * budget // device_bytes
        if slots[kind] < 1:
            raise ValueError(
                f"IRIS_LLM_HOST_KV_BYTES {budget} holds not one {kind} unit: the device pools "
                f"take {device_bytes} bytes, a {kind} unit {unit_bytes[kind]} bytes; give at "
                f"least {-(-device_bytes // device_slots[kind])} bytes or 0 (off)"
            )
    if device_slots[PAGE] and not unit_bytes[PAGE]:
        slots[PAGE] = max(1, slots[WINDOW] + slots[STATE])  # names only: nodes of the tree
    return TierSizing(slots, dict(unit_bytes))


class HostTier:
    """Host slots for each kind: `take` / `give`, `save` / `load` by kind, `before_step`."""

    def __init__(
        self,
        budget: int,
        full: KVCache,
        window: KVCache | None,
        states: StatePool | None,
        device: torch.device,
        journal: list[tuple[int, int, int]] | None = None,
        check_memory: bool = True,
    ) -> None:
        pin = device.type == "cuda"
        snapshot_slots = states.snapshot_slots if states is not None else 0
        device_slots = {
            PAGE: full.num_pages,
            WINDOW: window.num_pages - 1 if window is not None else 0,
            STATE: snapshot_slots,
        }
        unit = {
            PAGE: _page_bytes(full),
            WINDOW: _page_bytes(window) if window is not None else 0,
            STATE: _slot_bytes(states) if states is not None else 0,
        }
        self.sizing = size_tier(budget, device_slots, unit)
        if check_memory and self.sizing.total_bytes > (left := host_memory_left()):
            raise ValueError(
                f"IRIS_LLM_HOST_KV_BYTES {budget} is more than the host memory left to this "
                f"pod ({left} bytes: available memory, or its cgroup's limit less its usage)"
            )
        slots = self.sizing.slots
        self._units = {
            PAGE: _Pages(full, slots[PAGE], pin) if unit[PAGE] else None,
            WINDOW: _Pages(window, slots[WINDOW], pin) if window is not None else None,
            STATE: _States(states, slots[STATE], pin) if states is not None else None,
        }
        self.capacity = dict(slots)
        self._free = {kind: list(range(slots[kind] - 1, -1, -1)) for kind in KINDS}
        self.journal = journal
        self.stats = TierStats()
        self.fail_loads = 0  # a test hook: the next N loads fail (LoadFailedError)
        # Each device unit's generation: raised when the unit leaves the tree or the device
        # (`left`), so a store write queued before can tell it was reused.
        self.generations = {kind: [0] * device_slots[kind] for kind in KINDS}
        self.generations[WINDOW] = [0] * (device_slots[WINDOW] + 1)  # the null page too
        # Snapshot slots are numbered after the running ones.
        self.generations[STATE] = [0] * (states.conv.shape[1] if states is not None else 0)
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._device = device
        self._pending = False

    def has(self, kind: str) -> bool:
        """Whether the tier keeps units of `kind` (the model has that pool)."""
        return self.capacity[kind] > 0

    def used(self, kind: str) -> int:
        return self.capacity[kind] - len(self._free[kind])

    @property
    def fill(self) -> float:
        """Share of the tier's bytes in use, 0..1."""
        total = self.sizing.total_bytes
        used = sum(self.used(kind) * self.sizing.unit_bytes[kind] for kind in KINDS)
        return used / total if total else 0.0

    def take(self, kind: str) -> int | None:
        """A free slot of `kind`, or None when every one is taken."""
        free = self._free[kind]
        return free.pop() if free else None

    def give(self, kind: str, slot: int) -> None:
        self._free[kind].append(slot)

    def save(self, kind: str, device_index: int, slot: int) -> None:
        """Copy a device unit into host `slot` (the device unit may be reused after)."""
        self._copy(kind, True, device_index, slot)
        self.stats.bytes_to_host += self.sizing.unit_bytes[kind]
        if self.journal is not None:
            self.journal.append((SAVE[kind], device_index, slot))

    def load(self, kind: str, slot: int, device_index: int) -> None:
        """Copy host `slot` into a device unit; LoadFailedError if the copy fails."""
        if self.fail_loads:
            self.fail_loads -= 1
            self.stats.load_failures += 1
            raise LoadFailedError(f"injected failure loading host {kind} slot {slot}")
        try:
            self._copy(kind, False, slot, device_index)
        except RuntimeError as err:
            self.stats.load_failures += 1
            raise LoadFailedError(f"loading host {kind} slot {slot} failed: {err}") from err
        self.stats.bytes_to_device += self.sizing.unit_bytes[kind]
        if self.journal is not None:
            self.journal.append((LOAD[kind], slot, device_index))

    def unit_bytes(self, kind: str) -> int:
        return self.sizing.unit_bytes[kind]

    def device_bytes(self, kind: str, device_index: int) -> bytes:
        """A device unit's bytes (read by the store's writer thread)."""
        units = self._units[kind]
        return units.device_bytes(device_index) if units is not None else b""

    def fill_slot(self, kind: str, slot: int, payload: bytes) -> bool:
        """Host `slot` from a store payload; False (nothing written) when its length is
        not this pod's unit's."""
        if len(payload) != self.sizing.unit_bytes[kind]:
            return False
        if payload:
            self._units[kind].fill(slot, payload)
        return True

    def left(self, kind: str, device_index: int) -> None:
        """A device unit left the tree or the device: writes queued for it are void."""
        self.generations[kind][device_index] += 1

    def replay(self, entries: list[tuple[int, int, int]]) -> None:
        """Another rank's copies (rank 0's journal), in order."""
        for code, first, second in entries:
            kind, saving = _BY_CODE[code]
            self._copy(kind, saving, first, second)

    def before_step(self) -> None:
        """The compute stream waits for the copies issued so far (CUDA; nothing on the CPU)."""
        if self._pending:
            torch.cuda.current_stream(self._device).wait_stream(self._stream)
            self._pending = False

    def _copy(self, kind: str, saving: bool, source: int, target: int) -> None:
        units = self._units[kind]
        if units is None or not self.sizing.unit_bytes[kind]:
            return  # nothing held for this kind (a full pool for no layers)
        run = units.save if saving else units.load
        if self._stream is None:
            run(source, target)
            return
        # After what the compute stream has queued (a leaving page may still be written).
        self._stream.wait_stream(torch.cuda.current_stream(self._device))
        with torch.cuda.stream(self._stream):
            run(source, target)
        self._pending = True
