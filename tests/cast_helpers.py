"""Genuine casts built without a GPU: real builtin kernels for real signatures, compiled by NVRTC for
sm_90 and packaged by the exporter's pure `package` step. Evidence fields are left empty (nothing was
measured here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from card_helpers import captured, cudaify

from engine.capture.signature import signature_text
from engine.cards import card_from_row
from engine.cast.format import write_cast
from engine.export.package import ExportVariant, package
from engine.propose.builtin import BuiltinProposer

H200_ENV = {"torch": torch.__version__, "torch_minor": ".".join(torch.__version__.split(".")[:2]),
            "cuda": "13.0", "gpu": "NVIDIA H200", "arch": "sm_90", "compute_capability": [9, 0],
            "driver": "13.0", "nvrtc": "13.0"}


def captured_card(fn, want: str) -> dict[str, Any]:
    """The card (store-row shape) of the `want` op that `fn` runs, captured on CPU, described as on CUDA."""
    t = captured(fn, lambda op: op == want)
    sig = cudaify(t.signature)
    return {"card_id": t.id, "op": t.op, "signature": sig, "signature_text": signature_text(sig),
            "outputs": cudaify(t.outputs), "calls": 1, "share": 0.5}


def group_norm_card() -> dict[str, Any]:
    x = torch.randn(1, 64, 16, 16, dtype=torch.float16)
    w = torch.ones(64, dtype=torch.float16)
    return captured_card(lambda: F.group_norm(x, 32, w, w, 1e-6), "aten::native_group_norm")


def relu_card() -> dict[str, Any]:
    x = torch.randn(2, 64, 8, 8, dtype=torch.float16)
    return captured_card(lambda: torch.relu(x), "aten::relu")


def variant_for(card: dict[str, Any]) -> ExportVariant:
    """Render the builtin proposer's default kernel for the card and compile it for sm_90."""
    from engine.compile import compile_nvrtc

    brief = card_from_row(card)
    template, why = BuiltinProposer().template_for(brief)
    assert template is not None, why
    r = template.render(brief, template.default(brief))
    res = compile_nvrtc(r.source, arch="sm_90")
    assert res.ok, res.summary()
    cand = {"id": f"cand-{card['card_id'][:6]}", "source": r.source, "launch_spec": r.spec, "proposer": "builtin",
            "model_name": template.name, "intent": r.intent, "params": r.params, "status": "verified"}
    return ExportVariant(card, cand, res.cubin, res.ptx, "sm_90")


_CACHE: dict[str, ExportVariant] = {}


def genuine_variants() -> list[ExportVariant]:
    if not _CACHE:
        for name, make in (("group_norm", group_norm_card), ("relu", relu_card)):
            _CACHE[name] = variant_for(make())
    return list(_CACHE.values())


def write_genuine_cast(path: Path, env: dict[str, Any] | None = None,
                       targets: list[str] | None = None) -> dict[str, Any]:
    """Write a two-variant cast (group_norm, relu) and return its manifest; `targets`: the targets every
    variant is held to (None: none held, every target)."""
    variants = genuine_variants()
    for v in variants:
        v.targets = targets
    manifest, files, report = package(variants, env or H200_ENV,
                                      {"run": "run-test", "model": "test", "provider": "builtin"},
                                      created="2020-01-01T00:00:00Z")
    write_cast(path, manifest, files, report)
    return manifest


def edit_manifest(src: Path, dst: Path, change) -> None:
    """Copy a cast, letting `change(manifest)` edit its manifest in place (a hand-edited or hostile file)."""
    import json
    import zipfile

    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for name in zin.namelist():
            data = zin.read(name)
            if name == "manifest.json":
                m = json.loads(data)
                change(m)
                data = json.dumps(m).encode()
            zout.writestr(name, data)


def mark_member(src: Path, dst: Path, member: str, *, encrypted: bool = False, method: int | None = None) -> None:
    """Copy a cast with one member's zip headers saying it is encrypted (`zip -e`) or compressed by another
    method (9: Deflate64, 99: AES), as other zip tools write them; its bytes are unchanged."""
    import struct
    import zipfile

    raw = bytearray(src.read_bytes())
    with zipfile.ZipFile(src) as z:
        info = z.getinfo(member)
    local = info.header_offset
    central = raw.find(b"PK\x01\x02")  # the first central directory entry; walk to the member's
    while central != -1:
        n = struct.unpack_from("<H", raw, central + 28)[0]
        if bytes(raw[central + 46: central + 46 + n]) == member.encode():
            break
        central = raw.find(b"PK\x01\x02", central + 4)
    assert central != -1, member
    for flags_at, method_at in ((local + 6, local + 8), (central + 8, central + 10)):
        if encrypted:
            struct.pack_into("<H", raw, flags_at, struct.unpack_from("<H", raw, flags_at)[0] | 0x1)
        if method is not None:
            struct.pack_into("<H", raw, method_at, method)
    dst.write_bytes(bytes(raw))
