"""The cards a lane worker holds, within a share of its GPU's memory.

A loaded card keeps every input set of its check on the GPU: its samples, two fresh draws and the edge sets,
about a dozen copies of its inputs. The worker kept every card it was sent for the whole run, so a model with
large activations filled the GPU: on an H100 (80 GB) the SD3.5 VAE's largest GroupNorm card (a 512 MB input,
loaded after 26 others) failed all 9 of its candidates as "launch" (out of GPU memory), where the H200's
141 GB had held them (2026-12-06).

`CardCache` keeps the cards' request, which is small, for good and the loaded card only while the loaded cards
fit `budget` bytes: loading one past it puts the least recently used others down, and a card asked for again is
loaded again from its request. A reload is the same card: its samples come from the same files, and its drawn
sets from the same seeds. Out of memory while loading, every other card is put down and the load tried once
more; so is a request on a card that ran out of memory (`Worker.with_room`). Pure Python (the worker passes the
loader, the size of a loaded card, and what frees the device's cached blocks), so it is tested without a GPU.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

import torch

T = TypeVar("T")

# The share of the GPU's memory the loaded cards may hold. The rest is the work of one evaluation: eager's
# and the candidate's outputs, the precision check's float64 copies (a 512 MB bf16 input has 2 GB of them per
# copy), the compile references' workspaces, the L2 flush buffer.
CARD_SHARE = 0.5
BUDGET_ENV = "KFORGE_LANE_CARD_BYTES"  # a budget of the user's, in bytes (tests set a small one)


def card_budget(total: int, free: int, env: dict[str, str] | None = None) -> int:
    """Bytes the loaded cards may hold: CARD_SHARE of the GPU's memory, at most what was free when the worker
    started (on unified memory, what the host has available), or `KFORGE_LANE_CARD_BYTES` where it is set."""
    import os

    text = (os.environ if env is None else env).get(BUDGET_ENV, "").strip()
    if text:
        try:
            return max(0, int(float(text)))
        except ValueError:
            raise ValueError(f"{BUDGET_ENV}={text!r}: give a number of bytes, e.g. 20e9") from None
    return int(min(total * CARD_SHARE, free))


def out_of_memory(e: BaseException) -> bool:
    """Whether `e` says the GPU ran out of memory: torch's error, or a lane rejection that carries its words
    ("memory: out of GPU memory: …", "compile: torch.compile (default) failed: OutOfMemoryError: CUDA out of memory")."""
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()


def storage_bytes(tensors: Iterable[Any]) -> int:
    """Bytes the tensors' storages hold, each storage once (views share theirs; a worker's cards are on its GPU)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and not t.is_meta:
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


class CardCache(Generic[T]):
    def __init__(self, load: Callable[[dict[str, Any]], T], size: Callable[[T], int], budget: int, *,
                 oom: tuple[type[BaseException], ...] = (torch.OutOfMemoryError,),
                 release: Callable[[], None] = lambda: None):
        self._load, self._size, self.budget = load, size, budget
        self._oom, self._release = oom, release
        self.requests: dict[str, dict[str, Any]] = {}
        self.loaded: OrderedDict[str, T] = OrderedDict()  # least recently used first
        self.sizes: dict[str, int] = {}
        self.loads = self.reloads = self.put_down = 0

    @property
    def held(self) -> int:
        return sum(self.sizes.values())

    def add(self, request: dict[str, Any]) -> tuple[T, bool]:
        """(the card of `request`, whether it was loaded already)."""
        cid = request["card_id"]
        if cid in self.loaded:
            self.loaded.move_to_end(cid)
            return self.loaded[cid], True
        if cid in self.requests:
            self.reloads += 1  # put down since it was last loaded
        self.requests[cid] = request
        return self._bring(cid), False

    def get(self, cid: str) -> T | None:
        """The card, loaded again where it was put down; None for a card never added."""
        if cid in self.loaded:
            self.loaded.move_to_end(cid)
            return self.loaded[cid]
        if cid not in self.requests:
            return None
        self.reloads += 1
        return self._bring(cid)

    def relieve(self, keep: str | None = None) -> bool:
        """Put down every loaded card but `keep`; whether there was any."""
        others = [c for c in self.loaded if c != keep]
        for c in others:
            self._put_down(c)
        if others:
            self._release()
        return bool(others)

    def _bring(self, cid: str) -> T:
        try:
            card = self._load(self.requests[cid])
        except self._oom:
            if not self.relieve():
                raise
            card = self._load(self.requests[cid])
        self.loads += 1
        self.loaded[cid] = card
        for c, held in self.loaded.items():  # measured again: a card's check keeps more once it has checked a set
            self.sizes[c] = self._size(held)
        freed = False
        while self.held > self.budget and len(self.loaded) > 1:
            self._put_down(next(iter(self.loaded)))
            freed = True
        if freed:
            self._release()
        return card

    def drop(self, cid: str) -> None:
        """Put a loaded card down now (its next `get` loads it again from its request, as made at first)."""
        if cid in self.loaded:
            self._put_down(cid)

    def _put_down(self, cid: str) -> None:
        del self.loaded[cid]
        self.sizes.pop(cid, None)
        self.put_down += 1
