"""GpuLane: the asyncio client of one worker process, with a watchdog and automatic replacement."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from engine.errors import signal_name
from engine.lane.protocol import encode


@dataclass(frozen=True)
class LaneReply:
    """The answer to one request. `category` is set when it failed (compile, launch, runtime-fault,
    timeout, mismatch, nan, mutation, nondeterminism, suspicious, …); `restarted` when the worker was
    replaced because of this request."""

    ok: bool
    payload: dict[str, Any] = field(default_factory=dict)
    category: str | None = None
    message: str = ""
    restarted: bool = False
    seconds: float = 0.0


class LaneUnavailable(RuntimeError):
    """The worker cannot be started at all (bad environment, no GPU): not a candidate's fault."""


class GpuLane:
    """One worker process, one request at a time. Faults and hangs replace the worker, never the engine.

    Requests whose effect must survive a replacement (e.g. loading a card's samples) are sent with
    `sticky=True`: they are replayed, in order, to each new worker before the next request.
    """

    def __init__(self, argv: list[str], *, name: str = "lane0", timeout_s: float = 60.0,
                 start_timeout_s: float = 120.0, env: dict[str, str] | None = None,
                 stderr_lines: int = 200):
        self.argv = argv
        self.name = name
        self.timeout_s = timeout_s
        self.start_timeout_s = start_timeout_s
        self.env = env
        self.proc: asyncio.subprocess.Process | None = None
        self.pid: int | None = None
        self.restarts = 0
        self._next_id = 1
        self._lock = asyncio.Lock()
        self._sticky: dict[str, tuple[str, dict[str, Any]]] = {}
        self._stderr: collections.deque[str] = collections.deque(maxlen=stderr_lines)
        self._stderr_task: asyncio.Task | None = None
        self._replay_needed = False

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    async def start(self) -> None:
        """Start the worker and wait for its ready line."""
        env = {**os.environ, **(self.env or {}), "PYTHONUNBUFFERED": "1"}
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=env, start_new_session=True, limit=1 << 30)
        self.pid = self.proc.pid
        self._stderr_task = asyncio.create_task(self._drain_stderr(self.proc))
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), self.start_timeout_s)
        except asyncio.TimeoutError:
            await self._kill()
            raise LaneUnavailable(f"{self.name}: worker did not start within {self.start_timeout_s:.0f} s") from None
        if not line:
            await self.proc.wait()
            tail = " | ".join(list(self._stderr)[-5:])
            raise LaneUnavailable(f"{self.name}: worker exited at start (code {self.proc.returncode}): {tail}")
        self._replay_needed = bool(self._sticky)

    async def _drain_stderr(self, proc: asyncio.subprocess.Process) -> None:
        while True:
            line = await proc.stderr.readline()
            if not line:
                return
            self._stderr.append(line.decode(errors="replace").rstrip())

    def stderr_tail(self, n: int = 20) -> list[str]:
        return list(self._stderr)[-n:]

    async def _kill(self) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the whole group: a hung kernel's helpers too
        except ProcessLookupError:
            pass
        await self.proc.wait()

    async def _restart(self) -> None:
        await self._kill()
        if self._stderr_task is not None:
            await asyncio.wait([self._stderr_task], timeout=2)
        self.restarts += 1
        await self.start()

    async def _roundtrip(self, kind: str, payload: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        rid = self._next_id
        self._next_id += 1
        self.proc.stdin.write(encode({"id": rid, "kind": kind, "payload": payload}))
        await self.proc.stdin.drain()
        line = await asyncio.wait_for(self.proc.stdout.readline(), timeout_s)
        if not line:
            raise EOFError
        reply = json.loads(line)
        if reply.get("id") != rid:
            raise RuntimeError(f"{self.name}: protocol out of step (got id {reply.get('id')}, sent {rid})")
        return reply

    async def request(self, kind: str, payload: dict[str, Any] | None = None, *,
                      timeout_s: float | None = None, sticky_key: str | None = None) -> LaneReply:
        """Send one request and wait for its reply (or the watchdog). Never raises for a bad candidate."""
        payload = payload or {}
        async with self._lock:
            if self.proc is None or self.proc.returncode is not None:
                await self.start()
            if self._replay_needed:
                self._replay_needed = False
                for k, p in list(self._sticky.values()):
                    await self._roundtrip(k, p, self.timeout_s)
            t0 = time.perf_counter()
            timeout = self.timeout_s if timeout_s is None else timeout_s
            try:
                reply = await self._roundtrip(kind, payload, timeout)
            except asyncio.TimeoutError:
                await self._restart()
                return LaneReply(False, category="timeout", restarted=True, seconds=time.perf_counter() - t0,
                                 message=f"no answer within {timeout:.1f} s; worker killed and replaced")
            except (EOFError, BrokenPipeError, ConnectionResetError):
                code = await self.proc.wait()
                tail = self.stderr_tail(8)
                await self._restart()
                how = signal_name(code) if code < 0 else f"exit code {code}"
                return LaneReply(False, category="runtime-fault", restarted=True,
                                 seconds=time.perf_counter() - t0,
                                 message=f"worker died ({how}) during {kind}",
                                 payload={"stderr": tail, "exit": code})
            seconds = time.perf_counter() - t0
            if reply.get("poisoned"):
                await self.proc.wait()
                await self._restart()
            elif sticky_key is not None and reply.get("ok"):
                self._sticky[sticky_key] = (kind, payload)
            return LaneReply(bool(reply.get("ok")), reply.get("payload") or {}, reply.get("category"),
                             reply.get("message", ""), bool(reply.get("poisoned")), seconds)

    async def close(self) -> None:
        """Ask the worker to exit; kill it if it does not."""
        if self.proc is None or self.proc.returncode is not None:
            return
        try:
            self.proc.stdin.write(encode({"id": -1, "kind": "shutdown"}))
            await self.proc.stdin.drain()
            await asyncio.wait_for(self.proc.wait(), 5)
        except (asyncio.TimeoutError, BrokenPipeError, ConnectionResetError):
            await self._kill()


def worker_argv(device_index: int) -> list[str]:
    """The command that starts the real GPU worker for one device."""
    return [sys.executable, "-m", "engine.lane.worker", "--device", str(device_index)]


