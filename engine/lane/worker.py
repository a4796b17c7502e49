"""The GPU worker: one process owning one GPU, answering lane requests one at a time.

Requests: `hello` (the device), `load_card` (samples onto the GPU, once per worker), `time_eager`,
`time_copy` and `time_compiled` (the card's reference timings), `evaluate` (launch, verify, time, re-check). A fault that poisons the CUDA context is reported and the
process exits (`WorkerFault`), so the client replaces it; a hang is the client's watchdog's business.
"""

from __future__ import annotations

import argparse
import ctypes
import random
import signal
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

import torch

from engine.bench.floor import CHAIN_OP, GpuCompute, chain_bytes, launch_floor_us, physics_floor
from engine.bench.stats import TimingStats
from engine.bench.timing import L2Flusher, TimingConfig, copy_bandwidth, max_sm_clock_mhz, time_copy
from engine.capture.samples import load_sample
from engine.compile import compile_nvrtc
from engine.lane.card_cache import CardCache, card_budget, out_of_memory, storage_bytes
from engine.lane.protocol import Rejected, WorkerFault, claim_stdout, serve, unb64
from engine.launch import Env, SpecError, parse_spec, resolve
from engine.launch import cuda_driver as drv
from engine.launch.launcher import CandidateLauncher, LaunchRejected
from engine.resources import available_device_bytes
from engine.verify.compare import compare_outputs
from engine.verify.guard import Canaries, GuardViolation
from engine.verify.inputs import clone_bound
from engine.verify.pipeline import CardCheck, as_list, card_check
from engine.verify.timed import TimedCandidate, against_control, audited_ab, time_alone, time_eager_alone

_CUDA_ERROR_MARKERS = ("CUDA error", "CUDA driver error", "cudaError", "CUBLAS_STATUS", "device-side assert")


Handler = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass
class LoadedCard:
    card_id: str
    op_name: str
    signature: dict[str, Any]
    outputs: list[dict[str, Any]]
    bytes: int
    samples: list[list[tuple[str, Any]]]
    check: CardCheck
    control: TimingStats | None = None  # eager timed alone (the control of every A/B on this card)


def _card_bytes(card: LoadedCard) -> int:
    """Device memory a loaded card holds: its check's input sets (its samples among them) and the eager answer it
    keeps from the set checked last, each storage once."""
    return storage_bytes(card.check.held_tensors())


_HOG_SOURCE = r'''// Spins until the candidate's stream releases it (or max_cycles): resident for the whole of the candidate's run,
// however long the host takes to launch it. Thread 0 polls; the others hold their slots at the barrier.
// Block 0 writes `gen` to *outcome where the release came while it spun, 0 where it spun to max_cycles or found
// the release already there (it started after the candidate's stream had gone on: not beside it either).
extern "C" __global__ void kf_hog(long long max_cycles, unsigned int* started, const unsigned int* released,
                                  unsigned int gen, unsigned int* outcome) {
  if (threadIdx.x == 0) {
    atomicAdd(started, 1u);
    long long t0 = clock64();
    bool freed = false, waited = false;
    while (clock64() - t0 < max_cycles) {
      if ((int)(*(volatile const unsigned int*)released - gen) >= 0) { freed = waited; break; }
      waited = true;
      __nanosleep(500);
    }
    if (blockIdx.x == 0) *(volatile unsigned int*)outcome = freed ? gen : 0u;
  }
  __syncthreads();
}
// One warp on the candidate's stream, launched after the hog: it returns once `want` hog blocks have started
// (or after max_ns), so the candidate's kernels are launched onto an already busy GPU.
extern "C" __global__ void kf_hog_gate(const unsigned int* started, unsigned int want, unsigned long long max_ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    if ((int)(*(volatile const unsigned int*)started - want) >= 0) return;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < max_ns);
}
// On the candidate's stream after its kernels: the hog's blocks may go.
extern "C" __global__ void kf_hog_release(unsigned int* released, unsigned int gen) {
  *(volatile unsigned int*)released = gen;
}
'''


def hog_threads(threads_per_sm: int) -> int:
    """Threads of a contention block: two leave 64 of an SM's threads, room for the gate's warp and none for a
    96-thread block. An SM of 1,536 threads (sm_86, sm_89, sm_120) holds one block of 992 and leaves 544: the gate
    then waited for blocks that could not all be resident (100 µs every busy run), and each SM kept room for the
    candidate's blocks."""
    return max(32, min(1024, (threads_per_sm - 64) // 2 // 32 * 32))


HOG_GATE_NS = 100_000  # the gate gives up after 100 µs (another process holding the GPU): the run goes on
HOG_MAX_S = 2e-3  # the hog's blocks leave after 2 ms at most (a candidate that waits for all its blocks to be resident)


class _Hog:
    """Blocks that hold 50–95 % of the SMs (two fill an SM's threads) while a candidate runs beside them: a gate on
    the candidate's stream waits until they are all resident, and a release after its kernels lets them go.
    A fixed spin was not enough: on an H100 the host launched the candidate ~34 µs after the blocks started, and
    they spun 30 µs, so the candidate met an idle GPU (docs/results/reproduce-h200/2026-12-05d)."""

    def __init__(self, arch: str, sms: int, clock_hz: float, device: torch.device, threads_per_sm: int = 2048):
        compiled = compile_nvrtc(_HOG_SOURCE, arch=arch, name="kf_hog.cu", want_ptx=False, pch=False,
                                 contract=False)  # ours: it reads the clock to hold the SMs
        if not compiled.ok or not compiled.cubin:
            raise RuntimeError(f"the contention kernel does not compile: {compiled.summary()}")
        self.module = drv.Module(compiled.cubin)
        self.fn = self.module.function("kf_hog")
        self.gate_fn = self.module.function("kf_hog_gate")
        self.release_fn = self.module.function("kf_hog_release")
        # [0] counts the blocks that started, [1] the last generation released (both count up, and wrap), [2] the
        # generation whose blocks were released while they spun (0: they spun to HOG_MAX_S).
        self.counters = torch.zeros(3, dtype=torch.int32, device=device)
        self.launched = self.gen = 0
        self._started = ctypes.c_void_p(self.counters.data_ptr())
        self._released = ctypes.c_void_p(self.counters.data_ptr() + 4)
        self._outcome = ctypes.c_void_p(self.counters.data_ptr() + 8)
        self._max_cycles = ctypes.c_int64(int(HOG_MAX_S * clock_hz))
        self._gen = ctypes.c_uint32(0)
        self._want = ctypes.c_uint32(0)
        self._max_ns = ctypes.c_uint64(HOG_GATE_NS)
        self.params = self._pack(self._max_cycles, self._started, self._released, self._gen, self._outcome)
        self.gate_params = self._pack(self._started, self._want, self._max_ns)
        self.release_params = self._pack(self._released, self._gen)
        self.sms = sms
        self.threads = hog_threads(threads_per_sm)
        self.rng = random.Random()

    @staticmethod
    def _pack(*args: Any) -> Any:
        return (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])

    def launch(self, stream: int, gate_stream: int) -> None:
        """The hog on `stream`, then the gate on `gate_stream` (the candidate's), which waits for its blocks.
        A launch copies its arguments, so the values below may change once it returned."""
        blocks = 2 * max(1, int(self.sms * self.rng.uniform(0.5, 0.95)))
        self.gen = self.gen % 0xFFFFFFFF + 1  # 1 .. 2**32 - 1: outcome 0 means "spun to its limit"
        self._gen.value = self.gen
        drv.launch(self.fn, (blocks, 1, 1), (self.threads, 1, 1), 0, stream, ctypes.addressof(self.params))
        self.launched = (self.launched + blocks) & 0xFFFFFFFF
        self._want.value = self.launched
        drv.launch(self.gate_fn, (1, 1, 1), (32, 1, 1), 0, gate_stream, ctypes.addressof(self.gate_params))

    def release(self, stream: int) -> None:
        """On the candidate's stream, after its kernels: the blocks of the last `launch` leave."""
        self._gen.value = self.gen
        drv.launch(self.release_fn, (1, 1, 1), (1, 1, 1), 0, stream, ctypes.addressof(self.release_params))

    def overlaps(self, side: Any, main: Any) -> bool:
        """Whether work on `main` runs while the blocks on `side` spin: launched on `side` and released from `main`
        at once, they must see the release (not spin to HOG_MAX_S). Synchronizes."""
        side.wait_stream(main)
        self.launch(side.cuda_stream, main.cuda_stream)
        self.release(main.cuda_stream)
        main.wait_stream(side)
        torch.cuda.synchronize(self.counters.device)
        return int(self.counters[2].item()) & 0xFFFFFFFF == self.gen


def pick_side_stream(make: Callable[[], Any], overlaps: Callable[[Any], bool], tries: int = 8) -> tuple[Any, bool]:
    """The first of up to `tries` new streams whose work runs beside the candidate's stream, and True; else the
    last one tried, and False. On an H100 (2026-12-05d) kernels on torch's default stream waited for the ones on a
    torch.cuda.Stream to end: two streams can share one of the GPU's hardware queues, and then they take turns."""
    stream = None
    for _ in range(max(1, tries)):
        stream = make()
        if overlaps(stream):
            return stream, True
    return stream, False


class Worker:
    def __init__(self, device_index: int):
        torch.cuda.set_device(device_index)
        self.device = torch.device("cuda", device_index)
        torch.zeros(1, device=self.device)  # create the primary context before the driver API uses it
        drv.init()
        self.props = torch.cuda.get_device_properties(self.device)
        self.arch = f"sm_{self.props.major}{self.props.minor}"
        self.max_shared = int(getattr(self.props, "shared_memory_per_block_optin", 48 * 1024))
        self.shared_per_sm = drv.device_attribute("CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR",
                                                  device_index)
        self.flush = L2Flusher(self.device)
        # Loaded cards within a share of the GPU's memory; one put down is loaded again when asked for.
        self.cards: CardCache[LoadedCard] = CardCache(self._load_card, _card_bytes, card_budget(
            int(self.props.total_memory), available_device_bytes(self.device, props=self.props)),
            release=torch.cuda.empty_cache)
        self.copy_bw = copy_bandwidth(self.device)
        mem_khz = drv.device_attribute("CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE", device_index)
        bus_bits = drv.device_attribute("CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH", device_index)
        self.spec_bw = 2.0 * mem_khz * 1e3 * bus_bits / 8
        # Faster than this is physically impossible from DRAM (with the L2 flushed before each call).
        self.physics_bw = max(self.spec_bw, 1.15 * self.copy_bw)
        clock_mhz = max_sm_clock_mhz(self.device)
        self._peak = GpuCompute(self.arch, self.props.multi_processor_count,
                               (clock_mhz if clock_mhz == clock_mhz else 3000.0) * 1e6)  # unknown: a high clock
        self.launch_us = launch_floor_us(self.device)
        self._hog, self._side, self.contention = self._start_contention()
        self._contended = self._hog_running = False

    def _start_contention(self) -> tuple[Any, Any, bool]:
        """The contention blocks and their stream: one seen to run beside torch's default stream (pick_side_stream).
        Where none does, the busy-stream runs go without them (`hello` says so): blocks that only run before or
        after the candidate hold nothing while it runs. A contention kernel that does not build, or a check that
        fails, costs the blocks, never the worker."""
        main = torch.cuda.current_stream(self.device)
        try:
            hog = _Hog(self.arch, self.props.multi_processor_count, self._peak.clock_hz, self.device,
                       getattr(self.props, "max_threads_per_multi_processor", 2048))
            side, ok = pick_side_stream(lambda: torch.cuda.ExternalStream(drv.nonblocking_stream(), device=self.device),
                                        lambda stream: hog.overlaps(stream, main))
            return hog, side, ok
        except (drv.DriverError, RuntimeError) as e:
            print(f"kforge lane: busy-stream runs without contention blocks: {e}", file=sys.stderr)
            return None, torch.cuda.Stream(self.device), False

    @contextmanager
    def _contend(self):
        """Run the body's candidate as on a busy GPU: its blocks spread out, one per SM at most (`_run_candidate`,
        `CandidateLauncher.spread`), and, where the worker found a stream that runs beside the candidate's
        (`self.contention`), a random share of the SMs held with long-lived blocks on that stream: a candidate
        launched beside them cannot have all its blocks resident at once, so it meets the block interleavings of
        a busy GPU (a race that needs contention shows). The blocks are started by `_launch_beside` just before
        the candidate's kernels, after its outputs and workspaces are filled (a large card's fills take longer
        than any fixed spin), and released after them."""
        self._contended = True
        try:
            yield
        finally:
            self._contended = False
            if self._hog_running:
                self._hog_running = False
                torch.cuda.current_stream(self.device).wait_stream(self._side)

    def _launch_beside(self, go: Callable[[], Any]) -> Any:
        """`go()` (a prepared launch), beside the contention blocks where `_contend` is on."""
        if self._contended and self.contention:
            main = torch.cuda.current_stream(self.device)
            self._side.wait_stream(main)
            self._hog.launch(self._side.cuda_stream, main.cuda_stream)  # the gate: the hog's blocks are resident
            self._hog_running = True
            try:
                outs = go()
            except BaseException:
                with suppress(Exception):  # a broken context: the hog leaves after HOG_MAX_S anyway
                    self._hog.release(main.cuda_stream)
                raise
            self._hog.release(main.cuda_stream)
            return outs
        return go()

    # ---- requests ---------------------------------------------------------------------------------

    def hello(self, p: dict[str, Any]) -> dict[str, Any]:
        """The device, as `engine.propose.base.Hardware.from_hello` reads it (plus timing figures)."""
        props, i = self.props, self.device.index
        return {"name": props.name, "arch": self.arch, "capability": [props.major, props.minor],
                "sms": props.multi_processor_count,
                "l2_bytes": props.L2_cache_size, "max_shared_per_block": self.max_shared,
                "shared_per_sm": self.shared_per_sm,
                "max_threads_per_sm": drv.device_attribute("CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR", i),
                "cluster_launch": bool(drv.device_attribute("CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH", i)),
                "integrated": bool(drv.device_attribute("CU_DEVICE_ATTRIBUTE_INTEGRATED", i)),
                "copy_bw": self.copy_bw, "spec_bw": self.spec_bw, "physics_bw": self.physics_bw,
                "launch_floor_us": self.launch_us, "contention": self.contention,
                "torch": torch.__version__, "memory_bytes": self.props.total_memory}

    def load_card(self, p: dict[str, Any]) -> dict[str, Any]:
        card, cached = self.cards.add(p)
        c = self.cards
        return {"samples": len(card.samples), "cached": cached, "held_bytes": c.held, "budget_bytes": c.budget,
                "loaded": len(c.loaded), "put_down": c.put_down, "reloads": c.reloads}

    def _load_card(self, p: dict[str, Any]) -> LoadedCard:
        cid = p["card_id"]
        samples = [load_sample(path, self.device, p["signature"]).args for path in p["samples"]]
        if not samples:
            raise Rejected("protocol", f"card {cid}: no samples to verify against")
        # An ATen card's eager is its op; a chain card's, its members run in order (engine.verify.pipeline).
        check = card_check(p["op"], p["signature"], samples, sync=torch.cuda.synchronize,
                           fresh=p.get("fresh", 2), edges=p.get("edges", True), contend=self._contend)
        nbytes = int(p.get("bytes", 0))
        if p["op"] == CHAIN_OP:  # its traffic is its inputs and outputs, not its members' (see floor.py)
            nbytes = chain_bytes(p["signature"], p["outputs"])
        return LoadedCard(cid, p["op"], p["signature"], p["outputs"], nbytes, samples, check)

    def _card(self, p: dict[str, Any]) -> LoadedCard:
        card = self.cards.get(p["card_id"])  # loaded again where it was put down to make room
        if card is None:
            raise Rejected("protocol", f"card {p['card_id']} is not loaded in this worker")
        return card

    def time_eager(self, p: dict[str, Any]) -> dict[str, Any]:
        card = self._card(p)
        stats, throttled = time_eager_alone(card.check, self.flush, TimingConfig.from_json(p.get("timing")))
        card.control = stats
        roofline = card.bytes / self.copy_bw * 1e6 if card.bytes else None
        return {"eager": stats.__dict__, "throttled": throttled, "roofline_us": roofline}

    def time_copy(self, p: dict[str, Any]) -> dict[str, Any]:
        """This GPU's own copy of the card's floor bytes (read plus written), timed as eager alone is."""
        card = self._card(p)
        if not card.bytes:
            raise Rejected("protocol", f"card {card.card_id}: no floor bytes to copy")
        free = available_device_bytes(self.device, props=self.props)
        stats, throttled = self._guarded(lambda: time_copy(card.bytes, self.device, self.flush,
                                                           TimingConfig.from_json(p.get("timing")),
                                                           max_bytes=free // 2))
        return {"copy": stats.__dict__, "bytes": card.bytes, "throttled": throttled}

    def time_compiled(self, p: dict[str, Any]) -> dict[str, Any]:
        """The card's eager compiled by torch.compile (`mode`), checked against eager on the first sample
        and timed as eager alone is. One torch.compile cannot take is `compile`, one that answers
        differently from eager `mismatch`; the engine bounds the time this request may take."""
        from engine.bench.compiled import MODE, compile_eager

        card = self._card(p)
        mode = p.get("mode") or MODE
        t0 = time.perf_counter()
        try:
            torch._dynamo.reset()  # one card's graphs never count against the next one's recompile limit
            fn = compile_eager(card.check.eager, card.samples[0], mode)
            got = as_list(fn(clone_bound(card.samples[0])))
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - whatever Inductor raises is this card's reason, not the worker's
            text = str(e).strip()
            if any(m in text for m in _CUDA_ERROR_MARKERS):
                raise WorkerFault("runtime-fault", text.splitlines()[0]) from None
            raise Rejected("compile", f"torch.compile ({mode}) failed: {type(e).__name__}: "
                           f"{(text.splitlines() or [''])[0][:300]}") from None
        compile_s = time.perf_counter() - t0
        want = as_list(card.check.eager(clone_bound(card.samples[0])))
        # Values only: Inductor may lay an output out otherwise, which changes nothing about its time.
        bad = [r for r in compare_outputs(_dense(got), _dense(want), card.check.tolerances(want)) if not r.ok]
        if bad:
            raise Rejected("mismatch", f"torch.compile ({mode}) answers differently from eager: {bad[0].message}")
        stats, throttled = self._guarded(lambda: time_alone(card.check, fn, self.flush,
                                                            TimingConfig.from_json(p.get("timing"))))
        return {"compiled": stats.__dict__, "throttled": throttled, "mode": mode, "compile_s": compile_s}

    def with_room(self, handler: Handler) -> Handler:
        """`handler` (a request on one card), tried once more where it ran out of GPU memory with other cards
        loaded: they are put down first (loaded again when asked for), so that a candidate or a reference is
        judged on its own card and not on what else the lane holds."""
        def run(p: dict[str, Any]) -> dict[str, Any]:
            try:
                return handler(p)
            except (Rejected, torch.OutOfMemoryError) as e:
                if not out_of_memory(e) or not self.cards.relieve(keep=p.get("card_id")):
                    raise
            return handler(p)
        return run

    def evaluate(self, p: dict[str, Any]) -> dict[str, Any]:
        card = self._card(p)
        t0 = time.perf_counter()
        try:
            spec = parse_spec(p["spec"])
            free = available_device_bytes(self.device, props=self.props)  # MemAvailable on unified memory
            resolved = resolve(spec, Env.from_card(card.signature, card.outputs), max_shared=self.max_shared,
                               max_workspace_bytes=free // 2)
        except SpecError as e:
            raise Rejected("launch", f"launch spec: {e}") from None
        module = self._load_module(p)
        try:
            canaries = Canaries(self.device)
            try:
                launcher = CandidateLauncher(module, resolved, card.op_name, card.outputs, self.device,
                                             max_shared=self.max_shared, canaries=canaries,
                                             shared_per_sm=self.shared_per_sm)
            except LaunchRejected as e:
                raise Rejected("launch", str(e)) from None

            def run(bound, prefill):
                return self._run_candidate(launcher, canaries, bound, prefill)

            verdict = self._guarded(lambda: card.check.check(run))
            if not verdict.ok:
                raise Rejected(verdict.category, verdict.message, {"verdict": verdict.to_json(),
                                                                  "seconds": time.perf_counter() - t0})
            result: dict[str, Any] = {"verdict": verdict.to_json()}
            if p.get("time", True):
                cfg = TimingConfig.from_json(p.get("timing"))
                timed_candidate = TimedCandidate(launcher.prepare, after=canaries.enqueue_check,
                                                 overran=canaries.pending_violation)
                timed = self._guarded(lambda: audited_ab(card.check, timed_candidate, self.flush, cfg))
                timing = timed.ab
                result["timing"] = {**timing.to_json(keep_samples=p.get("keep_samples", False)),
                                    **timed.to_json()}
                if timed.category == "overrun":
                    raise Rejected("overrun", timed.message, result)
                floor = self._floor(card)
                result["physics_floor_us"] = floor.us
                result["physics_floor"] = floor.to_json()
                if timing.candidate.median < floor.us:
                    raise Rejected("suspicious", f"median {timing.candidate.median:.2f} µs is below the "
                                   f"{floor.us:.2f} µs floor: {floor.reason()}: it cannot have done the work",
                                   result)
                if timed.category is not None:
                    raise Rejected(timed.category, timed.message, result)
                self._check_control(card, timing, cfg, result)
                again = self._guarded(lambda: card.check.recheck_in_place(run, timed.slot))
                if not again.ok:
                    raise Rejected(again.category, again.message, {**result, "verdict": again.to_json()})
                self._guarded(card.check.require_held_intact)   # timed and audited calls wrote nowhere in them
            result["seconds"] = time.perf_counter() - t0
            return result
        finally:
            module.unload()
            if card.check.held_damaged:   # the next candidate is checked on the sets as made, not as this one left them
                self.cards.drop(p["card_id"])

    def _run_candidate(self, launcher: CandidateLauncher, canaries: Any, bound: Any, prefill: Any) -> list[Any]:
        """One verification run of the candidate. Inside `_contend` (verification's busy runs) its blocks run
        spread out, one per SM at most (`CandidateLauncher.spread`), beside the contention blocks where a stream
        overlaps; timed and audited calls, which share the launcher, run as the spec asked."""
        canaries.forget()
        launcher.spread = self._contended
        try:
            outs = self._launch_beside(launcher.prepare(bound, prefill))
        finally:
            launcher.spread = False
        torch.cuda.synchronize()
        bad = canaries.violations()
        canaries.forget()
        if bad:
            raise GuardViolation("wrote outside its buffers: " + "; ".join(bad))
        return outs

    def _floor(self, card: LoadedCard):
        return physics_floor(card.op_name, card.signature, card.bytes, bandwidth=self.physics_bw,
                             peak=self._peak, launch_us=self.launch_us)

    def _check_control(self, card: LoadedCard, timing: Any, cfg: TimingConfig, result: dict[str, Any]) -> None:
        """Eager beside the candidate must not read slower than eager alone (the card's control). Where it
        does (twice measured), the speedup is taken against eager alone: a candidate that slows eager
        down gains nothing by it, and neither does any other inflation of eager's side."""
        for attempt in range(2):
            if card.control is None or attempt:
                card.control, _ = self._guarded(lambda: time_eager_alone(card.check, self.flush, cfg))
            result["eager_alone_us"] = card.control.median
            fix = against_control(timing, card.control)
            if fix is None:
                return
        result["timing"].update(fix)

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
        except GuardViolation as e:
            raise Rejected("overrun", str(e)) from None
        except torch.OutOfMemoryError as e:
            # Not the candidate's fault (its workspaces are held to half the free memory by `resolve`): the sets
            # of a large card on a GPU that holds others (`with_room` tries once more with them put down).
            raise Rejected("memory", f"out of GPU memory: {str(e).splitlines()[0]}") from None
        except drv.DriverError as e:
            raise WorkerFault("runtime-fault", f"{e.name}: {e.text}") from None
        except RuntimeError as e:
            text = str(e)
            if any(m in text for m in _CUDA_ERROR_MARKERS):
                raise WorkerFault("runtime-fault", text.strip().splitlines()[0]) from None
            raise


def _dense(outputs: list[Any]) -> list[Any]:
    return [o.contiguous() if isinstance(o, torch.Tensor) else o for o in outputs]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Kernel Forge GPU lane worker (started by the engine)")
    ap.add_argument("--device", type=int, default=0)
    args = ap.parse_args(argv)
    # Ctrl-C in a terminal reaches the whole process group; the engine shuts its lanes down itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    proto = claim_stdout()  # before CUDA and torch start printing anything
    worker = Worker(args.device)
    room = worker.with_room
    return serve({"hello": worker.hello, "load_card": worker.load_card, "time_eager": room(worker.time_eager),
                  "time_copy": room(worker.time_copy), "time_compiled": room(worker.time_compiled),
                  "evaluate": room(worker.evaluate)}, proto)


if __name__ == "__main__":
    from engine.exits import leave_process

    sys.exit(leave_process(main()))
