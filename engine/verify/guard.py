"""Guard bands: every buffer handed to a candidate sits between canary regions of random bytes.

A kernel that writes past the end of an output (a vector store at the tail, an off-by-one grid) or
before its start clobbers whatever the allocator put next to it: in a model, another layer's
activations. The canaries make such a write visible: after a call, each region must still hold the
bytes it was filled with. The bytes are random per buffer and side (a generator seeded from the host's
entropy), so a kernel can neither restore them nor tell a guarded buffer by its two sides matching. Most
sides hold values, not noise: normal draws at a random scale, as float32, bfloat16 or float16 (a model's
neighbouring memory holds another tensor's values), the rest uniform bytes, the kind drawn on the host per
side. A kernel that reads past its buffers and computes honestly only where it finds noise there (a lane,
not a model) meets values in most checked calls.

Regions are checked either at once (`violations()`, one host sync) or queued on the device without a
sync (`enqueue_check()`), for timed calls, and read later (`pending_violation()`).
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

import torch

GUARD_BYTES = 64 * 1024  # each side at least (up to twice); a multiple of every element size and of 512 (the allocator's alignment)
# What a side of a canary holds, drawn per side: uniform bytes (None) or normal values of a dtype
_SIDE_KINDS = (None, torch.float32, torch.bfloat16, torch.float16)
_HOST = random.SystemRandom()


class GuardViolation(Exception):
    """A candidate wrote outside its buffers; the message names the buffer and the side."""


@dataclass
class _Region:
    name: str
    raw: torch.Tensor  # uint8: [canary | payload | canary]
    payload: int  # bytes between the canaries
    before: torch.Tensor  # the bytes of the canary before the payload, and after it: drawn for this buffer
    after: torch.Tensor


class Canaries:
    """Allocator of guarded buffers for one device, and the check of their canaries."""

    def __init__(self, device: torch.device | str, guard: int = GUARD_BYTES):
        self.device = torch.device(device)
        self.guard = guard
        seed = int.from_bytes(os.urandom(8), "little") & ((1 << 63) - 1)
        self._gen = torch.Generator(device=self.device).manual_seed(seed)
        self.regions: list[_Region] = []
        self._flag: torch.Tensor | None = None

    def buffer(self, nbytes: int, name: str = "buffer", device: torch.device | None = None) -> torch.Tensor:
        """`nbytes` of uninitialised uint8 memory with a canary region either side."""
        # Each side its own width (`guard` to twice it, in steps of 512 bytes: the allocator's alignment) and its
        # own random bytes, new for every buffer: with one pattern for all, the bytes just before any buffer
        # equalled those just after it, and a kernel could tell the lane's buffers from a model's by reading
        # both (a red-team stand-in computed honestly only there); with one width, where the next one began.
        gb, ga = (self.guard + 512 * _HOST.randrange(max(1, self.guard // 512)) for _ in range(2))
        raw = torch.empty(gb + nbytes + ga, dtype=torch.uint8, device=device or self.device)
        before, after = self._side(gb).to(raw.device), self._side(ga).to(raw.device)
        raw[:gb].copy_(before)
        raw[gb + nbytes:].copy_(after)
        self.regions.append(_Region(name, raw, nbytes, before, after))
        return raw[gb:gb + nbytes]

    def _side(self, g: int) -> torch.Tensor:
        """`g` bytes for one side of a canary: normal values at a scale between 1e-3 and 1e2 as one float
        dtype, or uniform bytes (the kind and scale drawn on the host: no device sync)."""
        dtype, dev = _HOST.choice(_SIDE_KINDS), self._gen.device
        if dtype is None or g % dtype.itemsize:
            return torch.randint(0, 256, (g,), dtype=torch.uint8, device=dev, generator=self._gen)
        vals = torch.randn(g // dtype.itemsize, device=dev, generator=self._gen) * 10 ** _HOST.uniform(-3, 2)
        return vals.to(dtype).view(torch.uint8)

    def empty_strided(self, shape, stride, dtype: torch.dtype, name: str = "out") -> torch.Tensor:
        """Like torch.empty_strided, inside a guarded buffer (the canaries touch the first and last element)."""
        isz = dtype.itemsize
        n = 0
        if all(s > 0 for s in shape):
            n = (sum((s - 1) * st for s, st in zip(shape, stride)) + 1) * isz
        buf = self.buffer(n, name=name)
        return torch.empty(0, dtype=dtype, device=self.device).set_(
            buf.untyped_storage(), buf.storage_offset() // isz, tuple(shape), tuple(stride))

    def forget(self) -> None:
        """Stop tracking the buffers handed out so far (they are freed once nothing else holds them)."""
        self.regions = []

    def violations(self) -> list[str]:
        """One line per damaged canary region of the tracked buffers (syncs the device)."""
        bad = []
        for r in self.regions:
            gb = r.before.numel()
            for side, view, pattern in (("before the start", r.raw[:gb], r.before),
                                        ("after the end", r.raw[gb + r.payload:], r.after)):
                g = pattern.numel()
                changed = view != pattern
                if bool(changed.any()):
                    idx = changed.nonzero().flatten()
                    count = int(idx.numel())
                    reach = int(g - idx[0]) if side == "before the start" else int(idx[-1]) + 1   # (g: this side's)
                    bad.append(f"{r.name}: {count} of the {g} bytes {side} were overwritten "
                               f"(up to {reach} bytes {'before' if side == 'before the start' else 'past'} it)")
        return bad

    def damaged(self) -> torch.Tensor | None:
        """A device boolean: whether any tracked region was damaged (queued, no sync); None if none tracked."""
        flag = None
        for r in self.regions:
            gb = r.before.numel()
            for view, pattern in ((r.raw[:gb], r.before), (r.raw[gb + r.payload:], r.after)):
                hit = torch.ne(view, pattern).any()
                flag = hit if flag is None else flag | hit
        return flag

    def enqueue_check(self) -> None:
        """Queue the comparison of every tracked region on the device (no sync), then forget them."""
        hit = self.damaged()
        if hit is not None:
            self._flag = hit if self._flag is None else self._flag | hit
        self.regions = []

    def pending_violation(self) -> bool:
        """Whether any region checked by `enqueue_check` since the last call was damaged (syncs)."""
        if self._flag is None:
            return False
        hit, self._flag = bool(self._flag), None
        return hit
