"""The lane worker's loaded cards within a share of the GPU's memory (engine.lane.card_cache): an H100 run of the
SD3.5 VAE held all 27 cards' input sets on the GPU and its largest GroupNorm card failed 9 of 9 candidates as
"launch" (out of GPU memory, 2026-12-06). Here with a loader that counts, and CPU tensors for the sizes."""

import pytest
import torch

from engine.lane.card_cache import CardCache, storage_bytes


class Oom(Exception):
    pass


def _cache(budget, sizes, *, fail_while_more_than=None):
    loads, released = [], []
    cache = CardCache(lambda p: loads.append(p["card_id"]) or {"id": p["card_id"], "v": p["v"]},
                      lambda card: sizes[card["id"]], budget, oom=(Oom,), release=lambda: released.append(1))
    if fail_while_more_than is not None:
        inner = cache._load

        def load(p):
            if len(cache.loaded) > fail_while_more_than:
                raise Oom("out of memory")
            return inner(p)
        cache._load = load
    return cache, loads, released


def test_cards_past_the_budget_put_down_the_least_recently_used_and_come_back_the_same():
    cache, loads, released = _cache(10, {"a": 4, "b": 4, "c": 4})
    for cid in "ab":
        card, cached = cache.add({"card_id": cid, "v": cid.upper()})
        assert not cached and card["id"] == cid
    assert cache.add({"card_id": "a", "v": "A"})[1]  # loaded already: a is now the most recently used
    cache.add({"card_id": "c", "v": "C"})             # 12 > 10: b, the least recently used, is put down
    assert list(cache.loaded) == ["a", "c"] and cache.held == 8 and released == [1]
    again = cache.get("b")                            # asked for again: loaded from its request
    assert again == {"id": "b", "v": "B"} and loads == ["a", "b", "c", "b"] and cache.reloads == 1
    assert list(cache.loaded) == ["c", "b"]           # a was the least recently used then
    cache.add({"card_id": "a", "v": "A2"})             # added again after it was put down: a reload too
    assert cache.reloads == 2 and cache.loaded["a"] == {"id": "a", "v": "A2"}
    assert cache.get("never added") is None


def test_one_card_larger_than_the_budget_is_still_held_alone():
    cache, _, _ = _cache(10, {"a": 4, "big": 30})
    cache.add({"card_id": "a", "v": 1})
    card, _ = cache.add({"card_id": "big", "v": 2})
    assert card["id"] == "big" and list(cache.loaded) == ["big"]


def test_out_of_memory_while_loading_puts_every_other_card_down_and_tries_once_more():
    cache, loads, released = _cache(100, {"a": 4, "b": 4, "c": 4}, fail_while_more_than=1)
    cache.add({"card_id": "a", "v": 1})
    cache.add({"card_id": "b", "v": 2})
    cache.add({"card_id": "c", "v": 3})   # two loaded: the load fails, both are put down, the retry loads it
    assert list(cache.loaded) == ["c"] and released == [1] and loads == ["a", "b", "c"]


def test_out_of_memory_with_nothing_else_loaded_is_the_cards_own():
    cache, _, _ = _cache(100, {"a": 4}, fail_while_more_than=-1)
    with pytest.raises(Oom):
        cache.add({"card_id": "a", "v": 1})


def test_relieve_keeps_the_card_in_use():
    cache, _, released = _cache(100, {"a": 1, "b": 1, "c": 1})
    for cid in "abc":
        cache.add({"card_id": cid, "v": 0})
    assert cache.relieve(keep="b") and list(cache.loaded) == ["b"] and released == [1]
    assert not cache.relieve(keep="b") and released == [1]  # nothing else: nothing released


def test_storage_bytes_counts_each_storage_once():
    x = torch.zeros(1000, dtype=torch.float32)
    view = x[10:20]
    y = torch.zeros(10, dtype=torch.bfloat16)
    meta = torch.empty(10**9, device="meta")
    assert storage_bytes([x, view, y, meta, 3, None]) == 4000 + 20


def test_the_budget_is_half_the_gpu_at_most_what_was_free_or_the_users():
    from engine.lane.card_cache import card_budget

    assert card_budget(80 * 10**9, 70 * 10**9, env={}) == 40 * 10**9
    assert card_budget(80 * 10**9, 30 * 10**9, env={}) == 30 * 10**9
    assert card_budget(80 * 10**9, 70 * 10**9, env={"KFORGE_LANE_CARD_BYTES": "2e9"}) == 2 * 10**9
    with pytest.raises(ValueError, match="KFORGE_LANE_CARD_BYTES='lots': give a number of bytes"):
        card_budget(1, 1, env={"KFORGE_LANE_CARD_BYTES": "lots"})


def test_sizes_are_measured_again_when_a_card_is_loaded():
    sizes = {"a": 4, "b": 4, "c": 1}
    cache, _, _ = _cache(10, sizes)
    cache.add({"card_id": "a", "v": 0})
    cache.add({"card_id": "b", "v": 0})
    sizes["b"] = 6  # b's check kept an answer since
    cache.add({"card_id": "c", "v": 0})  # 4 + 6 + 1 > 10: a, the least recently used, goes
    assert list(cache.loaded) == ["b", "c"] and cache.held == 7


def test_out_of_memory_is_told_by_torchs_error_or_the_rejections_words():
    from engine.lane.card_cache import out_of_memory
    from engine.lane.protocol import Rejected

    assert out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert out_of_memory(Rejected("memory", "out of GPU memory: CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert out_of_memory(Rejected("compile", "torch.compile (default) failed: OutOfMemoryError: CUDA out of memory."))
    assert not out_of_memory(Rejected("launch", "launch spec: grid too large"))
    assert not out_of_memory(RuntimeError("CUDA error: an illegal memory access was encountered"))


def test_a_request_that_ran_out_of_memory_is_tried_once_more_with_the_other_cards_put_down():
    from types import SimpleNamespace

    from engine.lane.protocol import Rejected
    from engine.lane.worker import Worker

    cache, _, released = _cache(100, {"a": 1, "b": 1, "c": 1})
    for cid in "abc":
        cache.add({"card_id": cid, "v": 0})
    calls = []

    def handler(p):
        calls.append(list(cache.loaded))
        if len(calls) == 1:
            raise Rejected("memory", "out of GPU memory: CUDA out of memory. Tried to allocate 2.00 GiB")
        return {"ok": p["card_id"]}

    run = Worker.with_room(SimpleNamespace(cards=cache), handler)
    assert run({"card_id": "b"}) == {"ok": "b"}
    assert calls == [["a", "b", "c"], ["b"]] and released == [1]

    def wrong(p):  # not memory: the candidate's own failure, not tried again
        calls.append(p)
        raise Rejected("launch", "launch spec: grid too large")

    calls.clear()
    with pytest.raises(Rejected, match="grid too large"):
        Worker.with_room(SimpleNamespace(cards=cache), wrong)({"card_id": "b"})
    assert len(calls) == 1

    def alone(p):  # out of memory with nothing else loaded: the card's own
        calls.append(p)
        raise torch.OutOfMemoryError("CUDA out of memory")

    calls.clear()
    with pytest.raises(torch.OutOfMemoryError):
        Worker.with_room(SimpleNamespace(cards=cache), alone)({"card_id": "b"})
    assert len(calls) == 1


def test_a_card_put_down_on_purpose_is_made_again_from_its_request():
    # The worker puts down a card whose stored input sets a candidate wrote into (CardCheck.held_damaged): the next
    # candidate is checked on the sets as made from the sample files, not as that one left them.
    cache, loads, _ = _cache(10, {"a": 4})
    first, _ = cache.add({"card_id": "a", "v": "A"})
    cache.drop("a")
    cache.drop("a")   # not loaded: nothing to do
    again = cache.get("a")
    assert again == first and again is not first and loads == ["a", "a"]
