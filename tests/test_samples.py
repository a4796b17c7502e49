"""Samples round-trip bit-exactly with their layout, aliasing and in-place pre/post state."""

import torch

from engine.capture.recorder import CaptureMode
from engine.capture.samples import load_sample, save_sample
from engine.capture.signature import bind_arguments, card_id, signature_of, signature_text


def _record(fn, tmp_path, samples=3):
    files = []

    def sink(tally, idx, snap, meta):
        path = tmp_path / f"{tally.id}.{idx}.safetensors"
        files.append(path)
        return save_sample(path, snap, meta)

    mode = CaptureMode(path_of=lambda: "m", weight_of=lambda p: 1, samples=samples,
                       sample_budget_bytes=1 << 30, sink=sink, use_cuda_events=False)
    with torch.no_grad(), mode:
        out = fn()
    return mode, files, out


def bits(t):
    return t.contiguous().view(-1).view(torch.uint8)


def test_odd_layouts_roundtrip_bit_exactly(tmp_path):
    base = torch.randn(4, 6, 8, 10, dtype=torch.bfloat16)
    cl = base.contiguous(memory_format=torch.channels_last)          # permuted strides
    offset = torch.randn(1000, dtype=torch.float16)[3:3 + 6 * 10].view(6, 10)  # odd storage offset
    bcast = torch.randn(10, dtype=torch.float16).expand(6, 10)       # stride-0 broadcast
    mode, files, _ = _record(lambda: (torch.mul(cl, 2.0), torch.add(offset, bcast)), tmp_path)
    assert len(files) == 2
    add = load_sample(next(f for f in files if "add" in load_sample(f).meta["op"]))
    (_, a), (_, b), _alpha = add.args
    assert a.stride() == offset.stride() and a.data_ptr() % 16 == offset.data_ptr() % 16
    assert b.stride() == (0, 1) and torch.equal(bits(b), bits(bcast))
    assert torch.equal(bits(a), bits(offset))
    mul = load_sample(next(f for f in files if "mul" in load_sample(f).meta["op"]))
    x = mul.args[0][1]
    assert x.stride() == cl.stride() and torch.equal(bits(x), bits(cl))
    assert mul.outputs.stride() == cl.stride()


def test_inplace_sample_keeps_pre_state_and_post_state(tmp_path):
    x = torch.randn(64)
    before = x.clone()
    mode, files, _ = _record(lambda: x.relu_(), tmp_path)
    (card,) = mode.cards.values()
    assert card.op == "aten::relu_"
    sample = load_sample(files[0])
    assert torch.equal(sample.args[0][1], before)          # pre-call state, negatives included
    assert torch.equal(sample.outputs, before.clamp_min(0))  # post-call state
    assert card.bytes == 2 * 64 * 4                          # read and written once


def test_aliased_arguments_share_storage_after_loading(tmp_path):
    x = torch.randn(32)
    mode, files, _ = _record(lambda: x.add_(x), tmp_path)
    (card,) = mode.cards.values()
    assert card.signature["aliases"] == [["self", "other"]]
    assert "alias(self=other)" in signature_text(card.signature)
    sample = load_sample(files[0])
    a, b = sample.args[0][1], sample.args[1][1]
    assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def test_out_variant_is_its_own_card_and_out_is_not_read(tmp_path):
    a, b, out = torch.randn(16), torch.randn(16), torch.empty(16)
    mode, _, _ = _record(lambda: (torch.add(a, b), torch.add(a, b, out=out)), tmp_path)
    ops = sorted(c.op for c in mode.cards.values())
    assert ops == ["aten::add.Tensor", "aten::add.out"]
    out_card = next(c for c in mode.cards.values() if c.op == "aten::add.out")
    assert out_card.bytes == 3 * 16 * 4  # two reads, one write; `out` is not read


def test_signature_distinguishes_layout_and_alignment():
    def sig(*args):
        f = torch.ops.aten.add.Tensor
        return signature_of(f, bind_arguments(f, args, {}))

    x = torch.randn(8, 8)
    y = torch.randn(8, 8)
    base = card_id(sig(x, y))
    assert card_id(sig(x, y)) == base
    assert card_id(sig(x.t(), y)) != base                       # strides
    misaligned = torch.randn(65)[1:].view(8, 8)
    assert card_id(sig(misaligned, y)) != base                  # 4-byte aligned, not 16
    assert card_id(sig(x.half(), y.half())) != base             # dtype
    assert card_id(sig(x, x)) != base                           # aliasing
    assert card_id(sig(x._neg_view(), y)) != base               # lazy negation flag
    assert sig(misaligned, y)["args"][0]["align"] == 4


def test_sample_budgets_keep_first_sample_of_every_card(tmp_path):
    files = []

    def sink(tally, idx, snap, meta):
        path = tmp_path / f"{tally.id}.{idx}.safetensors"
        files.append((tally.op, idx))
        return save_sample(path, snap, meta)

    mode = CaptureMode(path_of=lambda: "m", weight_of=lambda p: 1, samples=3, sample_budget_bytes=1 << 30,
                       sink=sink, use_cuda_events=False, total_budget_bytes=30_000)
    x = torch.randn(1024)  # 4 KiB in, 4 KiB out: ~8 KiB a sample
    with torch.no_grad(), mode:
        for _ in range(3):
            torch.relu(x)
        for _ in range(3):
            torch.neg(x)
    ops = [op for op, _ in files]
    assert ops.count("aten::relu") == 3 and ops.count("aten::neg") == 1  # total budget spent, first kept


def test_inputs_the_call_does_not_write_are_saved_as_they_were(tmp_path):
    # Inputs that nothing writes are saved without a copy; one sharing storage with a written argument
    # is copied before the call like the written one.
    x, w = torch.randn(64), torch.randn(32)
    before = x.clone()
    mode, files, _ = _record(lambda: (x[:32].add_(x[32:]), torch.mul(w, 3.0)), tmp_path)
    add = load_sample(next(f for f in files if "add_" in load_sample(f).meta["op"]))
    assert torch.equal(add.args[0][1], before[:32]) and torch.equal(add.args[1][1], before[32:])
    assert torch.equal(add.mutated["self"], before[:32] + before[32:])
    mul = load_sample(next(f for f in files if "mul" in load_sample(f).meta["op"]))
    assert torch.equal(mul.args[0][1], w) and torch.equal(mul.outputs, w * 3.0)


def test_sample_files_are_the_bytes_safetensors_writes(tmp_path, monkeypatch):
    """Samples are written in chunks by our own writer; the file must be the one `save_file` makes."""
    from engine.capture import samples

    g = torch.Generator().manual_seed(0)
    slabs = {f"in.{i}": torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8)
             for i, n in enumerate([5, 0, 17, 1, 64, 3, 8, 9, 2, 4, 1000, 7])}  # in.10 sorts before in.2
    slabs["out.0"] = torch.randint(0, 256, (4099,), generator=g, dtype=torch.uint8)
    slabs["in.3"] = torch.arange(256, dtype=torch.uint8).repeat(8)[5:300]  # a borrowed slab: a view
    # one key, as a sample has (safetensors orders several by a hash map)
    meta = {"kforge": '{"a":"q\\"uote \\\\ back / \\u00e9","n":[1,2.5e-07,null]} é\n\t\x01\x7f'}
    monkeypatch.setattr(samples, "_WRITE_CHUNK", 100)  # several chunks per slab
    samples.write_byte_slabs(tmp_path / "ours.safetensors", slabs, meta)
    samples.save_file(slabs, str(tmp_path / "theirs.safetensors"), metadata=meta)
    assert (tmp_path / "ours.safetensors").read_bytes() == (tmp_path / "theirs.safetensors").read_bytes()
    for k in range(1, 9):  # header padding: every remainder mod 8
        small = {"x": torch.zeros(k, dtype=torch.uint8)}
        samples.write_byte_slabs(tmp_path / "a", small, {"kforge": "y" * k})
        samples.save_file(small, str(tmp_path / "b"), metadata={"kforge": "y" * k})
        assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes()


def _slow_writes(monkeypatch, seconds=0.3):
    import time

    from engine.capture import samples

    write = samples.write_byte_slabs

    def slow(*a, **k):
        time.sleep(seconds)
        return write(*a, **k)

    monkeypatch.setattr(samples, "write_byte_slabs", slow)


def _captured_with_writer(tmp_path, fn, stable=frozenset()):
    from engine.capture.samples import SampleWriter

    writer = SampleWriter(stable)
    files = []

    def sink(tally, idx, snap, meta):
        files.append(tmp_path / f"{tally.id}.{idx}.safetensors")
        return writer.submit(files[-1], snap, meta)

    mode = CaptureMode(path_of=lambda: "m", weight_of=lambda p: 1, samples=1, sample_budget_bytes=1 << 30,
                       sink=sink, use_cuda_events=False, before_write=writer.before_write)
    with torch.no_grad(), mode:
        fn()
    writer.close()
    return writer, files


def test_background_writes_keep_what_the_call_read_though_the_forward_writes_it_later(tmp_path, monkeypatch):
    import hashlib

    from engine.capture.samples import storage_key

    _slow_writes(monkeypatch)
    x, w = torch.randn(8, 16), torch.randn(16, 4)
    x0, w0 = x.clone(), w.clone()

    def forward():
        torch.mm(x, w)
        x.numpy()[:] += 1  # an activation, written where no dispatch sees it: copied when its sample was queued
        w.mul_(2)  # a parameter, referenced by the queued file: the write waits for it

    writer, files = _captured_with_writer(tmp_path, forward, stable=frozenset({storage_key(w)}))
    mm = next(load_sample(f) for f in files if load_sample(f).meta["op"] == "aten::mm")
    got = dict(mm.args)
    assert torch.equal(got["self"], x0) and torch.equal(got["mat2"], w0)
    assert torch.equal(w, 2 * w0)
    for f in files:  # the digests are the files'
        assert writer.digests[f.name] == (hashlib.sha256(f.read_bytes()).hexdigest(), f.stat().st_size)


def test_a_failed_background_write_fails_the_capture(tmp_path):
    import pytest

    from engine.capture.samples import SampleWriter, snapshot_inputs

    writer = SampleWriter()
    snap, layout = snapshot_inputs([("self", torch.randn(4))])
    writer.submit(tmp_path / "missing" / "x.safetensors", snap, {"inputs": layout})
    with pytest.raises(FileNotFoundError):
        writer.close()


def _tiled_weight(rows=3, extra=5, dtype=torch.bfloat16):
    """A weight filled as a reference model's are (engine.models.random_init): one block repeated."""
    from engine.models.random_init import _FILL_BLOCK, _TiledFill

    w = torch.empty(rows * _FILL_BLOCK + extra, dtype=dtype)
    _TiledFill(seed=0, std=0.02).fill(w)
    return w


def _sample_of(files, op):
    return next(load_sample(f) for f in files if load_sample(f).meta["op"] == op)


def _tiled_capture(tmp_path, w, x):
    from engine.capture.samples import SampleWriter, storage_key
    from engine.models.random_init import fill_period

    periods = {storage_key(w): p} if (p := fill_period(w)) else {}
    writer = SampleWriter(frozenset({storage_key(w)}), periods)
    files, budgeted = [], []

    def sink(tally, idx, snap, meta):
        files.append(tmp_path / f"{tally.id}.{idx}.safetensors")
        budgeted.append(writer.submit(files[-1], snap, meta))
        return budgeted[-1]

    mode = CaptureMode(path_of=lambda: "m", weight_of=lambda p: 1, samples=1, sample_budget_bytes=1 << 40,
                       sink=sink, use_cuda_events=False, before_write=writer.before_write)
    with torch.no_grad(), mode:
        torch.mul(w, x)
    writer.close()
    return files, budgeted


def test_a_tiled_weight_is_stored_as_one_period_and_loads_back_bit_exactly(tmp_path):
    from engine.capture.samples import FORMAT_TILED, read_sample_meta
    from engine.models.random_init import _FILL_BLOCK, fill_period

    w = _tiled_weight()
    assert fill_period(w) == _FILL_BLOCK * 2
    x = torch.tensor(3.0, dtype=torch.bfloat16)
    files, budgeted = _tiled_capture(tmp_path, w, x)
    f = files[0]
    meta = read_sample_meta(f)
    assert meta["format"] == FORMAT_TILED and list(meta["tiled"].values()) == [w.numel() * 2]
    # one period of the weight and the whole output: not the weight's 6 MB again
    assert f.stat().st_size < fill_period(w) + w.numel() * 2 + 4096
    s = load_sample(f)
    assert torch.equal(bits(dict(s.args)["self"]), bits(w)) and torch.equal(s.outputs, w * x)
    # the capture's budgets count the sample as if it held the weight whole (as they did before)
    assert budgeted[0] > 2 * w.numel() * 2


def test_a_tiled_weight_written_since_its_fill_is_stored_whole(tmp_path):
    from engine.capture.samples import FORMAT, read_sample_meta

    w = _tiled_weight()
    w[1_000_007] += 1  # one element no longer repeats: the check sees it
    files, _ = _tiled_capture(tmp_path, w, torch.tensor(3.0, dtype=torch.bfloat16))
    assert read_sample_meta(files[0])["format"] == FORMAT
    assert files[0].stat().st_size > 2 * w.numel() * 2
    assert torch.equal(bits(dict(load_sample(files[0]).args)["self"]), bits(w))


def test_whole_size_is_the_size_of_the_file_with_every_slab_whole(tmp_path):
    from engine.capture.samples import snapshot_inputs, snapshot_outputs, storage_key, whole_size
    from engine.models.random_init import fill_period

    w = _tiled_weight(rows=2, extra=1000)
    snap, layout = snapshot_inputs([("self", w[10:]), ("other", torch.ones(3))])
    out_layout, mutated = snapshot_outputs(snap, torch.ones(2), {})
    meta = {"op": "x", "inputs": layout, "outputs": out_layout, "mutated": mutated}
    whole = save_sample(tmp_path / "whole.safetensors", snap, meta)
    assert whole_size(snap, meta) == whole
    snap.fold({storage_key(w): fill_period(w)})
    assert snap.tiled and whole_size(snap, meta) == whole
    assert save_sample(tmp_path / "tiled.safetensors", snap, meta) < whole / 2
    got = load_sample(tmp_path / "tiled.safetensors")
    assert torch.equal(bits(dict(got.args)["self"]), bits(w[10:]))


def test_repeats_is_a_bytewise_check(monkeypatch):
    from engine.capture import samples

    t = torch.arange(7, dtype=torch.uint8).repeat(50)
    for memcmp in (samples._memcmp(), None):  # libc's memcmp, and torch's fallback
        monkeypatch.setattr(samples, "_memcmp", lambda m=memcmp: m)
        assert samples.repeats(t, 7) and not samples.repeats(t, 6) and samples.repeats(t[:5], 7)
        u = t.clone()
        u[-1] += 1
        assert not samples.repeats(u, 7)
