"""Lanes on Ray: one actor per GPU of a cluster (or one per CPU, compile-only, for dry runs and CI), behind
the lane interface the search already awaits.

    lanes = await RayLanes.start("auto")                          # a GPU lane for every GPU the cluster offers
    ev = await lanes.evaluate(card_ref, compiled, spec, timing=t)  # an engine.lane.evaluate.Evaluation
    dry = await RayLanes.start(None, compile_only=True, arch="sm_90")
    ev = await dry.compile_only(source)                           # 'compiled' or a compile rejection

The calls made here:
- Each GPU actor (`num_gpus=1`) owns one lane worker process (`python -m engine.lane.worker --device 0`;
  Ray sets CUDA_VISIBLE_DEVICES) through a `GpuLane`, so a candidate's fault kills only that worker and the
  GpuLane inside the actor respawns it, replaying the card loads. `RayLane` is the head's proxy of one
  actor and answers `request()` like a GpuLane, so `engine.lane.evaluate.evaluate` and
  `engine.lane.eager.measure_eager` run on it unchanged.
- Card samples travel through the object store, once per actor: the head puts a card's sample files once
  (one object per card, shared by every actor); an actor that lacks the card is sent that object, writes
  the files under its own temporary directory and loads them from there. No shared filesystem is assumed.
- GPU lanes take compiled candidates: compiles stay on the head, in the engine's pool and cache (each
  candidate is compiled once; a cubin is a few KB to ship). Compile-only actors (`num_cpus=1`) compile in
  the actor with NVRTC, since there the compile is the work being spread.
- An actor lost mid-evaluation (killed, or its node gone) costs no candidate: it is re-queued once on
  another lane; a second loss is a rejected Evaluation with category `LANE_LOST`. The orchestrator gets one
  Evaluation per candidate, so none is counted twice.
- A joining node adds lanes: every `poll_s` the lanes compare `ray.cluster_resources()` with the actors
  they hold and start the missing ones (a lost actor is replaced the same way); a lane takes work only once
  its actor has answered, so an actor Ray cannot place yet gets none.
- `ray` is imported only when a function here is called (`require_ray`), never by importing this module.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from engine.cards import CardRef
from engine.compile import Compiler, CompileResult
from engine.errors import UsageError
from engine.lane.client import GpuLane, LaneReply, LaneUnavailable, worker_argv
from engine.lane.evaluate import Evaluation, compile_rejection, evaluate
from engine.outcomes import FAILURE_CATEGORIES

# The category of a candidate whose lane was lost twice ('internal' until engine.outcomes names it).
LANE_LOST = "lane-lost" if "lane-lost" in FAILURE_CATEGORIES else "internal"
INSTALL_HINT = 'pip install -e ".[ray]"'
DRY_RUN_MESSAGE = "compiled (dry run: not verified, not timed)"


def require_ray() -> Any:
    """The `ray` module, or a one-line UsageError naming the install command."""
    try:
        import ray
    except ImportError:
        raise UsageError(f"--ray needs Ray, which is not installed: {INSTALL_HINT}") from None
    return ray


def _lost_errors(ray: Any) -> tuple[type[BaseException], ...]:
    """The exceptions that mean the actor (or its node) is gone, not that the candidate failed."""
    ex = ray.exceptions
    names = ("RayActorError", "ActorDiedError", "ActorUnavailableError", "WorkerCrashedError",
             "NodeDiedError", "ObjectLostError", "OwnerDiedError")
    return tuple(getattr(ex, n) for n in names if isinstance(getattr(ex, n, None), type))


class LaneLost(LaneUnavailable):
    """The actor behind a lane is gone (killed, crashed, its node lost): the request never got an answer."""


# ---- actors (plain classes; wrapped with ray.remote when lanes are started) -----------------------------


class GpuLaneActor:
    """One GPU: a GpuLane (worker process) and the samples of the cards it was sent, on its host's disk."""

    def __init__(self, index: int, timeout_s: float = 120.0, argv: Sequence[str] | None = None) -> None:
        import ray

        self.host = socket.gethostname()
        gpus = ray.get_runtime_context().get_accelerator_ids().get("GPU") or []
        self.name = f"{self.host}/gpu{gpus[0]}" if gpus else f"{self.host}/lane{index}"
        # CUDA_VISIBLE_DEVICES holds only this actor's GPU, so the worker's device is always 0.
        self.lane = GpuLane(list(argv or worker_argv(0)), name=self.name, timeout_s=timeout_s)
        self.dir = Path(tempfile.mkdtemp(prefix="kforge-ray-"))
        self.samples: dict[str, list[str]] = {}
        self.requests = 0

    async def ready(self) -> dict[str, Any]:
        return {"name": self.name, "host": self.host, "pid": os.getpid()}

    async def put_card(self, card_id: str, files: list[tuple[str, bytes]]) -> None:
        """Write a card's sample files here (once per actor); load_card then names these paths."""
        d = self.dir / str(len(self.samples))
        d.mkdir(parents=True, exist_ok=True)
        paths = []
        for i, (name, data) in enumerate(files):
            p = d / f"{i}-{Path(name).name}"
            p.write_bytes(data)
            paths.append(str(p))
        self.samples[card_id] = paths

    async def request(self, kind: str, payload: dict[str, Any], timeout_s: float | None,
                      sticky_key: str | None) -> LaneReply:
        if kind == "load_card":
            local = self.samples.get(payload.get("card_id"))
            if local is None:
                return LaneReply(False, {"need_card": True}, "protocol", "card samples not sent to this actor")
            payload = {**payload, "samples": local}
        if kind == "evaluate":
            self.requests += 1
        return await self.lane.request(kind, payload, timeout_s=timeout_s, sticky_key=sticky_key)

    async def stats(self) -> dict[str, Any]:
        return {"name": self.name, "evaluations": self.requests, "worker_restarts": self.lane.restarts,
                "worker_pid": self.lane.pid}

    async def close(self) -> None:
        await self.lane.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class CompileLaneActor:
    """One CPU: compiles candidates with NVRTC (dry runs, CI); answers the same Evaluation as a dry run."""

    def __init__(self, index: int, arch: str, compiler: str = "nvrtc", cache_dir: str | None = None) -> None:
        self.host = socket.gethostname()
        self.name = f"{self.host}/cpu{index}"  # the head numbers its compile lanes
        self.compiler = Compiler(Path(cache_dir) if cache_dir else None, compiler, arch=arch)  # type: ignore[arg-type]
        self.evaluations = 0

    def ready(self) -> dict[str, Any]:
        return {"name": self.name, "host": self.host, "pid": os.getpid()}

    def compile_only(self, source: str) -> Evaluation:
        t0 = time.perf_counter()
        compiled = self.compiler.compile(source)
        self.evaluations += 1
        return compiled_evaluation(compiled, time.perf_counter() - t0)

    def stats(self) -> dict[str, Any]:
        return {"name": self.name, "evaluations": self.evaluations}

    def close(self) -> None:
        pass


def compiled_evaluation(compiled: CompileResult, seconds: float) -> Evaluation:
    """A dry run's Evaluation of one compile: 'compiled', or the compile rejection."""
    if not compiled.ok:
        return compile_rejection(compiled)
    return Evaluation("compiled", None, DRY_RUN_MESSAGE, compiled.seconds, compiled.log, compiled.cached,
                      seconds=seconds)


# ---- the head's side ---------------------------------------------------------------------------------


class RayLane:
    """The head's proxy of one actor; `request()` answers like GpuLane.request, or raises LaneLost."""

    def __init__(self, owner: RayLanes, actor: Any, name: str, host: str) -> None:
        self.owner = owner
        self.actor = actor
        self.name = name
        self.host = host
        self.dead = False
        self._sent: set[str] = set()     # cards whose samples this actor holds
        self._loaded: set[str] = set()   # sticky requests its GpuLane keeps (replayed to a new worker)

    async def _call(self, method: str, *args: Any) -> Any:
        try:
            return await getattr(self.actor, method).remote(*args)
        except self.owner.lost_errors as e:
            self.dead = True
            raise LaneLost(f"{self.name}: actor lost ({type(e).__name__})") from None

    async def request(self, kind: str, payload: dict[str, Any] | None = None, *,
                      timeout_s: float | None = None, sticky_key: str | None = None) -> LaneReply:
        payload = payload or {}
        if kind == "load_card":
            if sticky_key is not None and sticky_key in self._loaded:
                return LaneReply(True)  # loaded in this actor already: no round trip
            card_id = payload["card_id"]
            if card_id not in self._sent:
                await self._call("put_card", card_id, self.owner.samples_object(card_id, payload["samples"]))
                self._sent.add(card_id)
        reply = await self._call("request", kind, payload, timeout_s, sticky_key)
        if sticky_key is not None and reply.ok:
            self._loaded.add(sticky_key)
        return reply

    async def compile_only(self, source: str) -> Evaluation:
        return await self._call("compile_only", source)

    async def stats(self) -> dict[str, Any]:
        return await self._call("stats")


class RayLanes:
    """The lanes a Ray cluster offers: a free queue, re-queue on actor loss, growth as nodes join."""

    def __init__(self, ray: Any, *, compile_only: bool, actor_args: tuple, max_lanes: int | None = None,
                 poll_s: float = 5.0, gpus_per_lane: float = 1.0, start_timeout_s: float = 300.0,
                 owns_ray: bool = False) -> None:
        self.ray = ray
        self.compile_only_lanes = compile_only
        self.lost_errors = _lost_errors(ray)
        self.max_lanes = max_lanes
        self.poll_s = poll_s
        self.start_timeout_s = start_timeout_s
        self.owns_ray = owns_ray
        self.lanes: list[RayLane] = []
        self.lost: list[str] = []          # names of lanes whose actor was lost
        self.requeued = 0                  # candidates re-queued after a loss
        self._actor_args = actor_args
        if compile_only:
            self._resource, self._per_lane = "CPU", 1.0
            self._cls = ray.remote(num_cpus=1, max_restarts=0)(CompileLaneActor)
        else:
            self._resource, self._per_lane = ("GPU", gpus_per_lane) if gpus_per_lane else ("CPU", 1.0)
            opts = {"num_gpus": gpus_per_lane} if gpus_per_lane else {"num_cpus": 1}
            self._cls = ray.remote(**opts, max_restarts=0)(GpuLaneActor)
        self._free: asyncio.Queue[RayLane] = asyncio.Queue()
        self._starting: set[asyncio.Task] = set()
        self._samples: dict[str, Any] = {}
        self._poller: asyncio.Task | None = None
        self._spawned = 0

    @classmethod
    async def start(cls, address: str | None = None, *, compile_only: bool = False, arch: str = "sm_90",
                    compiler: str = "nvrtc", cache_dir: str | None = None, timeout_s: float = 120.0,
                    max_lanes: int | None = None, poll_s: float = 5.0, worker: Sequence[str] | None = None,
                    gpus_per_lane: float = 1.0, init: dict[str, Any] | None = None) -> RayLanes:
        """Connect to (or start) Ray, start a lane per GPU (per CPU with compile_only) and wait for them.

        `address`: a cluster ('auto', 'ray://host:10001'), or None for the running/local instance.
        `worker` replaces the lane worker's argv (tests use a stand-in); raises LaneUnavailable with no lane."""
        ray = require_ray()
        owns = False
        # Ray's driver replaces builtins.print process-wide (ray.experimental.tqdm_ray, on the first log line a
        # worker sends it) unless told not to: a model captured after that held Ray's print, not Python's, and its
        # module card's side-effect check read another function (CI, 2026-12-07)
        os.environ.setdefault("RAY_TQDM_PATCH_PRINT", "0")
        if not ray.is_initialized():
            kw = {"include_dashboard": False, "object_store_memory": 200 * 2**20} if address is None else {}
            ray.init(address=address, **{**kw, **(init or {})})
            owns = True
        args = (arch, compiler, cache_dir) if compile_only else (timeout_s, list(worker) if worker else None)
        lanes = cls(ray, compile_only=compile_only, actor_args=args, max_lanes=max_lanes, poll_s=poll_s,
                    gpus_per_lane=gpus_per_lane, owns_ray=owns)
        await lanes.grow(wait=True)
        if not lanes.lanes:
            what = "CPU" if compile_only or not gpus_per_lane else "GPU"
            await lanes.close()
            raise LaneUnavailable(f"ray: the cluster{f' at {address}' if address else ''} offers no {what} "
                                  "for a lane")
        if poll_s > 0:
            lanes._poller = asyncio.create_task(lanes._poll())
        return lanes

    # ---- membership ----

    def target(self) -> int:
        """How many lanes the cluster's resources allow now (capped by max_lanes)."""
        have = float(self.ray.cluster_resources().get(self._resource, 0.0))
        n = int(have // self._per_lane)
        return n if self.max_lanes is None else min(n, self.max_lanes)

    async def grow(self, *, wait: bool = False) -> int:
        """Start actors up to `target()`; with `wait`, until they have joined. Returns lanes started."""
        alive = sum(not lane.dead for lane in self.lanes)
        missing = self.target() - alive - len(self._starting)
        tasks = []
        for _ in range(max(0, missing)):
            self._spawned += 1
            task = asyncio.create_task(self._join(self._cls.remote(self._spawned - 1, *self._actor_args)))
            self._starting.add(task)
            task.add_done_callback(self._starting.discard)
            tasks.append(task)
        if wait and self._starting:  # those started by an earlier poll too
            await asyncio.gather(*list(self._starting), return_exceptions=True)
        return len(tasks)

    async def _join(self, actor: Any) -> None:
        try:
            info = await asyncio.wait_for(asyncio.wrap_future(actor.ready.remote().future()),
                                          self.start_timeout_s)
        except Exception:  # noqa: BLE001 - never placed or died at start: the next poll tries again
            self.ray.kill(actor)
            return
        lane = RayLane(self, actor, info["name"], info["host"])
        self.lanes.append(lane)
        self._free.put_nowait(lane)

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                await self.grow()
            except Exception:  # noqa: BLE001 - a GCS hiccup: keep the lanes we have, ask again later
                pass

    def _drop(self, lane: RayLane) -> None:
        lane.dead = True
        self.lost.append(lane.name)
        try:
            self.ray.kill(lane.actor)
        except Exception:  # noqa: BLE001 - already gone
            pass

    def lane(self, name: str) -> RayLane | None:
        """The live lane of that name (None when it is gone)."""
        return next((x for x in self.lanes if x.name == name and not x.dead), None)

    def names(self) -> list[str]:
        """The live lanes' names ('host/gpu0')."""
        return [lane.name for lane in self.lanes if not lane.dead]

    def by_host(self) -> dict[str, list[str]]:
        """Live lane names per host (for the `lanes` event, the TUI and --json)."""
        out: dict[str, list[str]] = {}
        for lane in self.lanes:
            if not lane.dead:
                out.setdefault(lane.host, []).append(lane.name)
        return out

    # ---- samples ----

    def samples_object(self, card_id: str, paths: Sequence[str]) -> Any:
        """The object holding a card's sample files (put once, shared by every actor)."""
        ref = self._samples.get(card_id)
        if ref is None:
            ref = self.ray.put([(Path(p).name, Path(p).read_bytes()) for p in paths])
            self._samples[card_id] = ref
        return ref

    # ---- work ----

    async def _take(self) -> RayLane:
        while True:
            try:
                lane = await asyncio.wait_for(self._free.get(), max(self.poll_s, 1.0))
            except asyncio.TimeoutError:
                if not any(not lane.dead for lane in self.lanes) and not self._starting:
                    await self.grow(wait=True)
                    if not any(not lane.dead for lane in self.lanes):
                        raise LaneUnavailable("ray: every lane was lost and the cluster offers no new one") from None
                continue
            if not lane.dead:
                return lane

    async def on_lane(self, work: Callable[[RayLane], Awaitable[Evaluation]], lane_use: Any = None) -> Evaluation:
        """Run `work` on a free lane; an actor lost under it re-queues it once, a second loss rejects it.

        `lane_use` (the orchestrator's LaneUse, or None) hears `busy(name)` and `free(status, category)` for
        each lane taken; a lost attempt is freed as 'interrupted' with category LANE_LOST."""
        losses: list[str] = []
        while True:
            lane = await self._take()
            if lane_use is not None:
                await lane_use.busy(lane.name)
            status, category = "error", "internal"
            try:
                ev = await work(lane)
                status, category = ev.status, ev.category
                return ev
            except asyncio.CancelledError:   # Ctrl-C: not an error of ours; --resume evaluates it again
                status, category = "interrupted", None
                raise
            except LaneLost as e:
                status, category = "interrupted", LANE_LOST
                losses.append(str(e))
                self._drop(lane)
                if len(losses) >= 2:
                    return Evaluation("rejected", LANE_LOST, "lane lost twice while evaluating it: "
                                      + "; ".join(losses), 0.0)
                self.requeued += 1
                print(f"kforge: {e}; candidate re-queued", file=sys.stderr)
            finally:
                if not lane.dead:
                    self._free.put_nowait(lane)
                if lane_use is not None:
                    await lane_use.free(status, category)

    async def evaluate(self, card: CardRef, compiled: CompileResult, spec: str | dict, *,
                       timing: dict[str, Any] | None = None, lane_use: Any = None) -> Evaluation:
        """Verify and time a compiled candidate on a free GPU lane (engine.lane.evaluate.evaluate over Ray)."""
        if not compiled.ok:
            return compile_rejection(compiled)
        return await self.on_lane(lambda lane: evaluate(lane, card, compiled, spec, timing=timing), lane_use)

    async def compile_only(self, source: str, *, lane_use: Any = None) -> Evaluation:
        """A dry run's evaluation of `source`, compiled in a free compile actor."""
        return await self.on_lane(lambda lane: lane.compile_only(source), lane_use)

    async def stats(self) -> list[dict[str, Any]]:
        """Each live actor's own counts (evaluations it ran, worker restarts)."""
        out = []
        for lane in self.lanes:
            if not lane.dead:
                try:
                    out.append(await lane.stats())
                except LaneLost:
                    pass
        return out

    async def close(self) -> None:
        """Stop polling, close every lane's worker, end the actors (and Ray, when these lanes started it)."""
        if self._poller is not None:
            self._poller.cancel()
        for task in list(self._starting):
            task.cancel()
        for lane in self.lanes:
            if lane.dead:
                continue
            try:
                await asyncio.wait_for(asyncio.wrap_future(lane.actor.close.remote().future()), 10)
            except Exception:  # noqa: BLE001 - closing a lost or stuck actor: kill it below
                pass
            self.ray.kill(lane.actor)
            lane.dead = True
        if self.owns_ray:
            self.ray.shutdown()
