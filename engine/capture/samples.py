"""Real input samples and eager outputs of a card, stored as safetensors (no pickle anywhere).

Each tensor is saved as the raw bytes of the storage range it touches ("slab"), together with its
dtype, shape, strides and byte offset, so a loaded sample is bit-exact and keeps the original layout,
alignment modulo 16 bytes, broadcast (zero) strides and the aliasing between arguments.

A slab whose bytes repeat with a known period (a weight filled from a tiled random block,
engine.models.random_init) is stored as its first period and its length (`tiled` in the header, format
`kforge-sample/2`) once the capture has checked that every byte repeats; loading repeats it back, so the
loaded sample is the same bytes. A gigabyte expert weight is then a 2 MB file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from engine.capture.signature import decode_value, dense_order, dtype_name, encode_value, storage_extent
from engine.ops import tensors_of

FORMAT = "kforge-sample/1"
FORMAT_TILED = "kforge-sample/2"  # as /1, plus `tiled`: slab name -> its length, stored as one period
_SLAB_ALIGN = 16


@dataclass
class Snapshot:
    """Host copies of a group of tensors, plus a JSON-able description referencing them."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    # group prefix -> storage key -> (slab name, byte start); groups never share slabs, so an in-place
    # op's output (same storage as its input) gets its own post-call copy.
    _slabs: dict[str, dict[tuple, tuple[str, int]]] = field(default_factory=dict)
    borrowed: dict[str, tuple] = field(default_factory=dict)  # slab name -> storage key it references
    keys: dict[str, tuple] = field(default_factory=dict)  # slab name -> storage key it was cut from
    tiled: dict[str, int] = field(default_factory=dict)  # slab name -> its length; the tensor holds one period

    @property
    def nbytes(self) -> int:
        """Bytes of the slabs as loaded (a tiled slab at its whole length)."""
        return sum(self.tiled.get(name, t.numel()) for name, t in self.tensors.items())

    def add_group(self, prefix: str, tensors: list[torch.Tensor], borrow: frozenset[tuple] = frozenset()) -> None:
        """Copy one slab per storage covering every tensor of `tensors` that lives in it; a CPU storage whose
        key (`_storage_key`) is in `borrow` is referenced instead, and must stay unwritten until saved."""
        group = self._slabs.setdefault(prefix, {})
        spans: dict[tuple, list[int]] = {}
        for t in tensors:
            key = _storage_key(t)
            lo, hi = storage_extent(t)
            if key in spans:
                spans[key][0] = min(spans[key][0], lo)
                spans[key][1] = max(spans[key][1], hi)
            else:
                spans[key] = [lo, hi]
        for key, (lo, hi) in spans.items():
            owner = next(t for t in tensors if _storage_key(t) == key)
            start = lo - lo % _SLAB_ALIGN
            raw = torch.empty(0, dtype=torch.uint8, device=owner.device).set_(owner.untyped_storage())
            name = f"{prefix}{len(group)}"
            borrowed = key in borrow and owner.device.type == "cpu"
            self.tensors[name] = raw[start:hi] if borrowed else raw[start:hi].to("cpu", copy=True).contiguous()
            if borrowed:
                self.borrowed[name] = key
            self.keys[name] = key
            group[key] = (name, start)

    def fold(self, periods: Mapping[tuple, int]) -> None:
        """Keep one period of each CPU slab whose storage has a period in `periods` (bytes) and whose bytes
        all repeat with it (checked here); the others stay as they are."""
        for name, key in self.keys.items():
            period, slab = periods.get(key), self.tensors[name]
            if (period and name not in self.tiled and slab.device.type == "cpu" and slab.numel() >= 2 * period
                    and repeats(slab, period)):
                self.tensors[name] = slab[:period].clone()
                self.tiled[name] = slab.numel()
                self.borrowed.pop(name, None)

    def own(self, keep: frozenset[tuple] = frozenset()) -> None:
        """Copy every borrowed slab whose storage is not in `keep`: the snapshot then outlives the call."""
        for name, key in list(self.borrowed.items()):
            if key not in keep:
                self.tensors[name] = self.tensors[name].clone()
                del self.borrowed[name]

    def ref(self, t: torch.Tensor, prefix: str) -> dict[str, Any]:
        name, start = self._slabs[prefix][_storage_key(t)]
        return {"slab": name, "dtype": dtype_name(t.dtype), "shape": list(t.shape),
                "stride": list(t.stride()), "offset": t.storage_offset() * t.element_size() - start}


def repeats(slab: torch.Tensor, period: int) -> bool:
    """Whether every byte of a contiguous 1-D uint8 CPU tensor equals the byte `period` bytes before it."""
    n = slab.numel()
    if n <= period:
        return True
    memcmp = _memcmp()
    if memcmp is not None:  # a plain memcmp: 0.07 s per GB here, where torch.equal takes 0.8 s
        return memcmp(slab.data_ptr() + period, slab.data_ptr(), n - period) == 0
    return torch.equal(slab[period:], slab[:-period])


_MEMCMP: list = []


def _memcmp() -> Any:
    """libc's memcmp through ctypes (which releases the GIL while it runs), or None where there is none."""
    if not _MEMCMP:
        fn = None
        try:
            import ctypes

            fn = ctypes.CDLL(None).memcmp  # the process's own libc (Linux, macOS)
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        except (OSError, AttributeError, TypeError):
            fn = None
        _MEMCMP.append(fn)
    return _MEMCMP[0]


def storage_key(t: torch.Tensor) -> tuple:
    """What names a tensor's storage while it lives (device, address, size). A wrapper tensor subclass (torchao's
    quantized weights, a user's scaled tensor) has no storage of its own: it is named by itself, a key no storage
    has (its data is read through the plain tensors it holds, as its own calls make them)."""
    try:
        return _storage_key(t)
    except (RuntimeError, NotImplementedError):
        return ("no storage", id(t))


def _storage_key(t: torch.Tensor) -> tuple:
    return (t.device.type, t.device.index, t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())


def _encode(value: Any, snap: Snapshot, prefix: str) -> Any:
    if isinstance(value, torch.Tensor):
        return {"tensor": snap.ref(value, prefix)}
    if isinstance(value, (list, tuple)):
        return {"list": [_encode(v, snap, prefix) for v in value]}
    return {"value": encode_value(value)}


def snapshot_inputs(bound: list[tuple[str, Any]], written: set[str] | None = None) -> tuple[Snapshot, list[dict[str, Any]]]:
    """Copy the pre-call state of every tensor argument; returns the snapshot and the argument layout.

    With `written` (the names of the arguments the call writes), a CPU storage that no written argument
    touches is referenced, not copied (a weight need not be copied to be saved): the caller saves the
    snapshot right after the call, before anything else can write it."""
    snap = Snapshot()
    tensors = [t for _, v in bound for t in tensors_of(v)]
    borrow: frozenset[tuple] = frozenset()
    if written is not None:
        dirty = {_storage_key(t) for name, v in bound if name in written for t in tensors_of(v)}
        borrow = frozenset(_storage_key(t) for t in tensors) - dirty
    snap.add_group("in.", tensors, borrow)
    return snap, [{"name": name, **_encode(v, snap, "in.")} for name, v in bound]


def snapshot_outputs(snap: Snapshot, outputs: Any, mutated: dict[str, torch.Tensor]) -> tuple[Any, dict]:
    """Add the eager outputs and the post-call state of mutated arguments to `snap`."""
    snap.add_group("out.", tensors_of(outputs) + list(mutated.values()))
    return _encode(outputs, snap, "out."), {k: snap.ref(t, "out.") for k, t in mutated.items()}


@dataclass(frozen=True)
class Sample:
    """A loaded sample: arguments in schema order, eager outputs, post-state of mutated arguments."""

    args: list[tuple[str, Any]]
    outputs: Any
    mutated: dict[str, torch.Tensor]
    meta: dict[str, Any]

    def call_args(self) -> tuple[tuple, dict]:
        """Positional and keyword arguments to call the op with (kwarg-only ones by name)."""
        kwarg_only = set(self.meta.get("kwarg_only", []))
        args = tuple(v for n, v in self.args if n not in kwarg_only)
        kwargs = {n: v for n, v in self.args if n in kwarg_only}
        return args, kwargs


def save_sample(path: Path, snap: Snapshot, meta: dict[str, Any]) -> int:
    """Write one sample file; returns its size in bytes."""
    header, tensors = _file_parts(snap, meta)
    if _byte_slabs(tensors):
        write_byte_slabs(path, tensors, header)
    else:
        save_file(tensors, str(path), metadata=header)
    return path.stat().st_size


def _file_parts(snap: Snapshot, meta: dict[str, Any]) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    extra = {"format": FORMAT_TILED, **meta, "tiled": snap.tiled} if snap.tiled else {"format": FORMAT, **meta}
    header = {"kforge": json.dumps(extra, separators=(",", ":"))}
    return header, snap.tensors or {"empty": torch.empty(0, dtype=torch.uint8)}


def whole_size(snap: Snapshot, meta: dict[str, Any]) -> int:
    """The size of the sample's file with every slab whole (what its tensors take once loaded): what the
    capture's sample budgets count, whether or not a slab is stored as one period."""
    header = {"kforge": json.dumps({"format": FORMAT, **meta}, separators=(",", ":"))}
    sizes = {name: snap.tiled.get(name, t.numel()) for name, t in snap.tensors.items()} or {"empty": 0}
    return len(_safetensors_header(sizes, header)[1]) + sum(sizes.values())


def _byte_slabs(tensors: dict[str, torch.Tensor]) -> bool:
    return all(t.dtype == torch.uint8 and t.dim() == 1 and t.is_contiguous() and t.device.type == "cpu"
               for t in tensors.values())


_WRITE_CHUNK = 64 << 20


def _safetensors_header(slabs: Mapping[str, torch.Tensor | int], metadata: dict[str, str]) -> tuple[list[str], bytes]:
    """The slabs' names in file order and the header bytes (length prefix included); a slab may be given by size."""
    names = sorted(slabs)
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for name in names:
        slab = slabs[name]
        n = slab if isinstance(slab, int) else slab.numel()
        header[name] = {"dtype": "U8", "shape": [n], "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    blob += b" " * (-len(blob) % 8)
    return names, len(blob).to_bytes(8, "little") + blob


def write_byte_slabs(path: Path, slabs: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    """Write 1-D uint8 CPU tensors as the safetensors file `save_file` writes, byte for byte (its header:
    compact JSON, `__metadata__` first, tensors by name, padded with spaces to 8 bytes; the data in that
    order; with one metadata key, as a sample has: safetensors orders several by a hash map), in 64 MB writes:
    one write of a gigabyte slab runs at half the speed here, and samples hold whole weight matrices."""
    names, head = _safetensors_header(slabs, metadata)
    with open(path, "wb", buffering=0) as f:
        _write_all(f, head)
        for name in names:
            data = memoryview(slabs[name].numpy())
            for i in range(0, len(data), _WRITE_CHUNK):
                _write_all(f, data[i:i + _WRITE_CHUNK])


def _sha256_of(slabs: dict[str, torch.Tensor], metadata: dict[str, str]) -> str:
    """The sha256 of the file `write_byte_slabs` writes for these slabs, without writing it."""
    import hashlib

    digest = hashlib.sha256()
    names, head = _safetensors_header(slabs, metadata)
    digest.update(head)
    for name in names:
        data = memoryview(slabs[name].numpy())
        for i in range(0, len(data), _WRITE_CHUNK):
            digest.update(data[i:i + _WRITE_CHUNK])
    return digest.hexdigest()


def _write_all(f: Any, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[f.write(view):]  # an unbuffered write may take less than all of it


class SampleWriter:
    """Writes sample files on one background thread, each hashed (sha256) as it is written, so a capture's
    forward computes while gigabytes of samples go to disk.

    A submitted snapshot must not change until written: `submit` copies its borrowed slabs except those of
    `stable` storages (the model's parameters and buffers, which a forward does not write); the capture
    calls `before_write` before each call that writes a tensor, which waits for the files still holding a
    stable storage it writes."""

    def __init__(self, stable: frozenset[tuple] = frozenset(), periods: Mapping[tuple, int] | None = None):
        import queue
        import threading

        self.stable = stable
        # storage key -> the period (bytes) its contents may repeat with: such slabs are stored as one period
        # where they do (Snapshot.fold checks)
        self.periods = dict(periods or {})
        self.file_bytes = 0  # what the queued files take on disk
        self.digests: dict[str, tuple[str, int]] = {}  # file name -> (sha256, bytes)
        self._queue: queue.Queue = queue.Queue()
        self._pending: dict[tuple, int] = {}  # stable storage key -> files not yet written that hold it
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="kforge-sample-writer", daemon=True)
        self._thread.start()

    def submit(self, path: Path, snap: Snapshot, meta: dict[str, Any]) -> int:
        """Queue one sample file; returns its size with every slab whole (`whole_size`)."""
        self._raise()
        if self.periods:
            snap.fold(self.periods)
        snap.own(self.stable)
        whole = whole_size(snap, meta)
        header, tensors = _file_parts(snap, meta)
        if not _byte_slabs(tensors):  # not our slabs: written now, by safetensors
            self.file_bytes += save_sample(path, snap, meta)
            return whole
        _, head = _safetensors_header(tensors, header)
        keys = list(snap.borrowed.values())
        with self._lock:
            for k in keys:
                self._pending[k] = self._pending.get(k, 0) + 1
        self._queue.put((path, tensors, header, keys))
        self.file_bytes += len(head) + sum(t.numel() for t in tensors.values())
        return whole

    def before_write(self, tensors: list[torch.Tensor]) -> None:
        """Called before a call writes `tensors`: waits for queued files that hold one of their storages."""
        with self._lock:
            busy = any(self._pending.get(_storage_key(t)) for t in tensors)
        if busy:
            self.flush()

    def flush(self) -> None:
        """Wait until every queued file is written; raises what a write raised."""
        self._queue.join()
        self._raise()

    def forget(self, paths: list[Path]) -> None:
        """Drop the digests of files removed after they were written."""
        for path in paths:
            self.digests.pop(path.name, None)

    def close(self) -> None:
        """Write what is queued and stop the thread."""
        self._queue.put(None)
        self._thread.join()
        self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _run(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        # A file is hashed on a second thread while it is written: past the page cache's dirty limit, writes
        # wait for the disk, and the hash then costs no time of its own.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="kforge-sample-hash") as hasher:
            self._serve(hasher)

    def _serve(self, hasher: Any) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is None:
                    return
                path, tensors, header, keys = job
                if self._error is None:  # after a failed write, the capture fails: nothing more is written
                    digest = hasher.submit(_sha256_of, tensors, header)
                    write_byte_slabs(path, tensors, header)
                    self.digests[path.name] = (digest.result(), path.stat().st_size)
            except BaseException as e:  # noqa: BLE001 - raised on the capture's thread
                self._error = e
            finally:
                if job is not None:
                    with self._lock:
                        for k in job[3]:
                            self._pending[k] -= 1
                self._queue.task_done()


def _rebuild(ref: dict[str, Any], slabs: dict[str, torch.Tensor]) -> torch.Tensor:
    slab = slabs[ref["slab"]]
    dtype = getattr(torch, ref["dtype"])
    isz = torch.empty(0, dtype=dtype).element_size()
    if ref["offset"] % isz:
        raise ValueError(f"sample tensor offset {ref['offset']} is not a multiple of {isz}")
    return torch.empty(0, dtype=dtype, device=slab.device).set_(
        slab.untyped_storage(), ref["offset"] // isz, ref["shape"], ref["stride"])


def _decode(node: dict[str, Any], slabs: dict[str, torch.Tensor]) -> Any:
    if "tensor" in node:
        return _rebuild(node["tensor"], slabs)
    if "list" in node:
        return [_decode(x, slabs) for x in node["list"]]
    return decode_value(node["value"])


def laid_out_as(args: list[tuple[str, Any]], signature: dict[str, Any]) -> list[tuple[str, Any]]:
    """Each tensor argument copied into the strides `signature` gives it, where the shapes agree, the strides
    differ and the signature's layout is dense (values and dtype unchanged; a fresh, aligned allocation)."""
    want = {a["name"]: a for a in signature.get("args", []) if a.get("kind") == "tensor" and not a.get("absent")}
    out = []
    for name, v in args:
        a = want.get(name)
        if (isinstance(v, torch.Tensor) and a is not None and list(v.shape) == list(a["shape"])
                and list(v.stride()) != list(a["stride"]) and dense_order(a["shape"], a["stride"]) is not None):
            t = torch.empty_strided(tuple(a["shape"]), tuple(a["stride"]), dtype=v.dtype, device=v.device)
            t.copy_(v)
            v = t
        out.append((name, v))
    return out


def hidden_args(signature: dict[str, Any], args: list[tuple[str, Any]], outputs: Any) -> list[tuple[str, Any]]:
    """A hidden card's arguments from a sample of the card it hides in: for a convolution bias, `self` is a fresh
    copy of the convolution's output, `other` its bias as `[1, C, 1, ...]`, `alpha` 1 (the layouts the signature
    gives them are applied after, as for any card: `laid_out_as`)."""
    how = (signature.get("hidden_in") or {}).get("how")
    if how != "convolution bias":
        raise ValueError(f"a hidden call the sample loader does not know: {how!r}")
    named = dict(args)
    out = outputs[0] if isinstance(outputs, (list, tuple)) else outputs
    want = {a["name"]: a for a in signature["args"]}
    bias = named.get("bias")
    if not isinstance(out, torch.Tensor) or not isinstance(bias, torch.Tensor):
        raise ValueError("the convolution's sample holds no output or no bias to derive the bias add from")
    return [("self", out.clone()), ("other", bias.reshape(want["other"]["shape"]).clone()),
            ("alpha", want["alpha"]["value"])]


def folded_args(signature: dict[str, Any], args: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """A conv-bias folded chain card's arguments (engine.capture.folds) from a sample of its plain GroupNorm ->
    SiLU chain card: the bias a stand-in, each channel's mean of the stored GroupNorm input `s` (rounded to its
    dtype), `in0` = s - bias (computed in float32 or wider, rounded once), the rest as stored. Then `in0 + bias`
    rounds to within a unit in the last place of the larger of `s` and `in0` (not always `s` itself: where
    |s - bias| > |s|, in0's grid is the coarser); the sample's outputs are not used (the reference is the chain run
    on these inputs). A per-channel mean is a realistic and demanding bias: large against the spread of its
    channel, so a kernel's rounding of `x + b` shows."""
    f = signature.get("folded_from") or {}
    if f.get("how") != "convolution bias":
        raise ValueError(f"a folded chain the sample loader does not know: {f.get('how')!r}")
    named = dict(args)
    s = named.get(f["inputs"]["in0"])
    if not isinstance(s, torch.Tensor) or s.dim() < 2:
        raise ValueError("the chain's sample holds no GroupNorm input to derive the folded card's inputs from")
    wide = torch.promote_types(s.dtype, torch.float32)
    bias = s.to(wide).mean(dim=[d for d in range(s.dim()) if d != 1]).to(s.dtype)
    shape = [1, s.shape[1]] + [1] * (s.dim() - 2)
    x = (s.to(wide) - bias.to(wide).reshape(shape)).to(s.dtype)
    derived = {"in0": x, f["bias"]: bias.reshape(shape).contiguous()}
    return [(a["name"], derived[a["name"]] if a["name"] in derived else named[f["inputs"][a["name"]]])
            for a in signature["args"]]


def read_sample_meta(path: Path) -> dict[str, Any]:
    """The JSON header of a sample file, without loading its tensors."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    if "kforge" not in meta:
        raise ValueError(f"{path}: not a Kernel Forge sample (no 'kforge' header)")
    data = json.loads(meta["kforge"])
    if data.get("format") not in (FORMAT, FORMAT_TILED):
        raise ValueError(f"{path}: unknown sample format {data.get('format')!r}")
    return data


def _untile(period: torch.Tensor, n: int) -> torch.Tensor:
    """A fresh 1-D uint8 tensor of `n` bytes: `period` repeated (and cut at `n`)."""
    if period.numel() == 0:
        raise ValueError("a tiled sample slab has an empty period")
    whole = period.repeat(-(-n // period.numel()))
    return whole[:n]


def load_sample(path: str | Path, device: str | torch.device = "cpu",
                signature: dict[str, Any] | None = None) -> Sample:
    """Load a sample onto `device`; tensors are fresh allocations with the captured layout, or, with the
    card's `signature`, the layout the signature gives each tensor argument (a card that shares another
    card's samples in another layout: a channels-last twin, engine.capture.twins), and for a hidden call's card
    or a conv-bias folded chain card the arguments it derives from the sample (engine.capture.hidden,
    engine.capture.folds)."""
    path = Path(path)
    meta = read_sample_meta(path)
    # A fresh allocation per slab: aligned like the original modulo 16 bytes, and never the mmap.
    slabs = {k: v.to(device, copy=True) for k, v in load_file(str(path)).items()}
    for name, n in meta.get("tiled", {}).items():
        slabs[name] = _untile(slabs[name], int(n))
    args = [(a["name"], _decode(a, slabs)) for a in meta["inputs"]]
    outputs = _decode(meta["outputs"], slabs)
    mutated = {k: _rebuild(r, slabs) for k, r in meta.get("mutated", {}).items()}
    if signature is not None and signature.get("hidden_in"):
        # A call the sampled one makes below the capture (engine.capture.hidden): its arguments come from this
        # sample's (hidden_args); its outputs are not recorded (what it returns is what eager computes from them).
        args, outputs, mutated = hidden_args(signature, args, outputs), None, {}
    elif signature is not None and signature.get("folded_from"):
        # A chain with a convolution's bias add in front (engine.capture.folds): its inputs derived from its plain
        # chain's sample (folded_args), before a twin's layout is applied; no outputs, as for a hidden call.
        args, outputs, mutated = folded_args(signature, args), None, {}
    if signature is not None:
        args = laid_out_as(args, signature)
    return Sample(args=args, outputs=outputs, mutated=mutated, meta=meta)
