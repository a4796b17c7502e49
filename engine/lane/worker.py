"""The GPU worker: one process owning one GPU, answering lane requests one at a time.

Requests: `hello` (the device), `load_card` (samples onto the GPU, once per worker), `time_eager`,
`evaluate` (launch, verify, time, re-check). A fault that poisons the CUDA context is reported and the
process exits (`WorkerFault`), so the client replaces it; a hang is the client's watchdog's business.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch

from engine.bench.timing import L2Flusher, TimingConfig, ab_time, copy_bandwidth, time_one
from engine.capture.samples import load_sample
from engine.lane.protocol import Rejected, WorkerFault, claim_stdout, serve, unb64
from engine.launch import Env, SpecError, parse_spec, resolve
from engine.launch import cuda_driver as drv
from engine.launch.launcher import CandidateLauncher, LaunchRejected
from engine.ops import call_op, resolve_op, return_aliases, write_only_args
from engine.verify.inputs import clone_bound
from engine.verify.pipeline import CardCheck

_CUDA_ERROR_MARKERS = ("CUDA error", "CUDA driver error", "cudaError", "CUBLAS_STATUS", "device-side assert")


@dataclass
class LoadedCard:
    card_id: str
    op_name: str
    signature: dict[str, Any]
    outputs: list[dict[str, Any]]
    bytes: int
    samples: list[list[tuple[str, Any]]]
    check: CardCheck


class Worker:
    def __init__(self, device_index: int):
        torch.cuda.set_device(device_index)
        self.device = torch.device("cuda", device_index)
        torch.zeros(1, device=self.device)  # create the primary context before the driver API uses it
        drv.init()
        self.props = torch.cuda.get_device_properties(self.device)
        self.arch = f"sm_{self.props.major}{self.props.minor}"
        self.max_shared = int(getattr(self.props, "shared_memory_per_block_optin", 48 * 1024))
        self.flush = L2Flusher(self.device)
        self.cards: dict[str, LoadedCard] = {}
        self.copy_bw = copy_bandwidth(self.device)
        mem_khz = drv.device_attribute("CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE", device_index)
        bus_bits = drv.device_attribute("CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH", device_index)
        self.spec_bw = 2.0 * mem_khz * 1e3 * bus_bits / 8
        # Faster than this is physically impossible from DRAM (with the L2 flushed before each call).
        self.physics_bw = max(self.spec_bw, 1.15 * self.copy_bw)

    # ---- requests ---------------------------------------------------------------------------------

    def hello(self, p: dict[str, Any]) -> dict[str, Any]:
        return {"name": self.props.name, "arch": self.arch, "sms": self.props.multi_processor_count,
                "l2_bytes": self.props.L2_cache_size, "max_shared_per_block": self.max_shared,
                "copy_bw": self.copy_bw, "spec_bw": self.spec_bw, "physics_bw": self.physics_bw,
                "torch": torch.__version__, "memory_bytes": self.props.total_memory}

    def load_card(self, p: dict[str, Any]) -> dict[str, Any]:
        cid = p["card_id"]
        if cid in self.cards:
            return {"samples": len(self.cards[cid].samples), "cached": True}
        samples = [load_sample(path, self.device).args for path in p["samples"]]
        if not samples:
            raise Rejected("protocol", f"card {cid}: no samples to verify against")
        op = resolve_op(p["op"])
        written = [a for a in return_aliases(op) if a] + write_only_args(op)
        check = CardCheck(p["op"], samples, lambda b: call_op(op, b), written_args=written,
                          sync=torch.cuda.synchronize, fresh=p.get("fresh", 2), edges=p.get("edges", True))
        self.cards[cid] = LoadedCard(cid, p["op"], p["signature"], p["outputs"], int(p.get("bytes", 0)),
                                     samples, check)
        return {"samples": len(samples), "cached": False}

    def _card(self, p: dict[str, Any]) -> LoadedCard:
        card = self.cards.get(p["card_id"])
        if card is None:
            raise Rejected("protocol", f"card {p['card_id']} is not loaded in this worker")
        return card

    def time_eager(self, p: dict[str, Any]) -> dict[str, Any]:
        card = self._card(p)
        op = resolve_op(card.op_name)
        inputs = clone_bound(card.samples[0])
        stats, throttled = time_one(lambda: call_op(op, inputs), self.flush, TimingConfig.from_json(p.get("timing")))
        roofline = card.bytes / self.copy_bw * 1e6 if card.bytes else None
        return {"eager": stats.__dict__, "throttled": throttled, "roofline_us": roofline}

    def evaluate(self, p: dict[str, Any]) -> dict[str, Any]:
        card = self._card(p)
        t0 = time.perf_counter()
        try:
            spec = parse_spec(p["spec"])
            resolved = resolve(spec, Env.from_card(card.signature, card.outputs), max_shared=self.max_shared)
        except SpecError as e:
            raise Rejected("launch", f"launch spec: {e}") from None
        module = self._load_module(p)
        try:
            try:
                launcher = CandidateLauncher(module, resolved, card.op_name, card.outputs, self.device,
                                             max_shared=self.max_shared)
            except LaunchRejected as e:
                raise Rejected("launch", str(e)) from None

            def run(bound, prefill):
                return launcher.run(bound, prefill)

            verdict = self._guarded(lambda: card.check.check(run))
            if not verdict.ok:
                raise Rejected(verdict.category, verdict.message, {"verdict": verdict.to_json(),
                                                                  "seconds": time.perf_counter() - t0})
            result: dict[str, Any] = {"verdict": verdict.to_json()}
            if p.get("time", True):
                op = resolve_op(card.op_name)
                inputs = clone_bound(card.samples[0])
                timing = self._guarded(lambda: ab_time(lambda: call_op(op, inputs),
                                                       lambda: launcher.run(inputs), self.flush,
                                                       TimingConfig.from_json(p.get("timing"))))
                result["timing"] = timing.to_json(keep_samples=p.get("keep_samples", False))
                floor_us = card.bytes / self.physics_bw * 1e6 if card.bytes else 0.0
                result["physics_floor_us"] = floor_us
                if timing.candidate.median < floor_us:
                    raise Rejected("suspicious", f"median {timing.candidate.median:.2f} µs is below the "
                                   f"{floor_us:.2f} µs that moving {card.bytes} bytes takes at "
                                   f"{self.physics_bw / 1e12:.2f} TB/s: it cannot have done the work",
                                   result)
                again = self._guarded(lambda: card.check.recheck_in_place(run, inputs))
                if not again.ok:
                    raise Rejected(again.category, again.message, {**result, "verdict": again.to_json()})
            result["seconds"] = time.perf_counter() - t0
            return result
        finally:
            module.unload()

    def _load_module(self, p: dict[str, Any]) -> drv.Module:
        errors = []
        for key in ("cubin", "ptx"):
            if not p.get(key):
                continue
            image = unb64(p[key]) if key == "cubin" else p[key].encode() + b"\0"
            try:
                return drv.Module(image)
            except drv.DriverError as e:
                errors.append(f"{key}: {e.name}")
        raise Rejected("launch", "cannot load the compiled module: " + ("; ".join(errors) or "no cubin or PTX"))

    def _guarded(self, fn):
        """Run GPU work; a CUDA error from a kernel poisons the context: report it and exit."""
        try:
            result = fn()
            torch.cuda.synchronize()
            return result
        except LaunchRejected as e:
            raise Rejected("launch", str(e)) from None
        except drv.DriverError as e:
            raise WorkerFault("runtime-fault", f"{e.name}: {e.text}") from None
        except RuntimeError as e:
            text = str(e)
            if any(m in text for m in _CUDA_ERROR_MARKERS):
                raise WorkerFault("runtime-fault", text.strip().splitlines()[0]) from None
            raise


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Kernel Forge GPU lane worker (started by the engine)")
    ap.add_argument("--device", type=int, default=0)
    args = ap.parse_args(argv)
    proto = claim_stdout()  # before CUDA and torch start printing anything
    worker = Worker(args.device)
    return serve({"hello": worker.hello, "load_card": worker.load_card, "time_eager": worker.time_eager,
                  "evaluate": worker.evaluate}, proto)


if __name__ == "__main__":
    sys.exit(main())
