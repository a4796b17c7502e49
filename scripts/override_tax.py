#!/usr/bin/env python3
"""What a Python-level override costs a host-bound model: ResNet-50 forwards (host time to issue one) with
nothing registered, with a bare torch.library pass-through for aten::native_batch_norm at the CUDA key,
and with a cast installed but suspended. Separates torch's own Python-kernel
mechanism from Kernel Forge's runtime.

    python scripts/override_tax.py [--cast resnet50.cast] --out DIR
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from engine.bench.host import issue_us, python_profile  # noqa: E402


def host_issue_us(forward) -> float:
    return issue_us(forward)[0]


def conv_share(forward) -> str:
    return python_profile(forward, calls=10, top=8)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cast")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    from engine.config import config_model

    _, forward = config_model("resnet50")
    op = torch.ops.aten.native_batch_norm.default
    doc: dict = {}
    with torch.no_grad():
        for _ in range(5):
            forward()
        doc["eager_us"] = host_issue_us(forward)
        doc["eager_profile"] = conv_share(forward)
        original = torch.library.get_kernel(op, "CUDA")
        lib = torch.library.Library("aten", "IMPL", "CUDA")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            lib.impl("native_batch_norm", lambda ks, *a: original.call_boxed(ks, *a), "CUDA", with_keyset=True)
        for _ in range(3):
            forward()
        doc["bare_passthrough_us"] = host_issue_us(forward)
        doc["bare_passthrough_profile"] = conv_share(forward)
        lib._destroy()
        doc["eager_again_us"] = host_issue_us(forward)
        if args.cast:
            import engine.cast
            from engine.cast import runtime

            cast = engine.cast.load(args.cast)
            cast.install()
            with runtime.suspended():
                for _ in range(3):
                    forward()
                doc["cast_suspended_us"] = host_issue_us(forward)
            doc["cast_us"] = host_issue_us(forward)
            cast.remove()
            doc["eager_after_cast_us"] = host_issue_us(forward)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "override_tax.json").write_text(json.dumps(doc, indent=1))
    print(json.dumps({k: v for k, v in doc.items() if not k.endswith("profile")}, indent=1))
    print(doc["eager_profile"], doc.get("bare_passthrough_profile", ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
