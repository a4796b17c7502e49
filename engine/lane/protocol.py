"""The lane wire protocol: one JSON object per line over the worker's stdin/stdout.

Plain JSON lines (binary as base64) so that a lane can later live on another host behind any byte
pipe (SSH, a socket). The worker side is `serve()`; the client side is `engine.lane.client.GpuLane`.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

# A worker that hit a fault which poisons its CUDA context replies once, then exits with this code so
# the client replaces it rather than sending more work into a broken context.
EXIT_POISONED = 3

Handler = Callable[[dict[str, Any]], dict[str, Any]]


class WorkerFault(Exception):
    """Raised by a handler: reply with `category`, then exit so the client starts a fresh worker."""

    def __init__(self, category: str, message: str, payload: dict[str, Any] | None = None):
        super().__init__(message)
        self.category = category
        self.payload = payload or {}


class Rejected(Exception):
    """Raised by a handler: the request failed with a category, the worker stays healthy."""

    def __init__(self, category: str, message: str, payload: dict[str, Any] | None = None):
        super().__init__(message)
        self.category = category
        self.payload = payload or {}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"))


def encode(msg: dict[str, Any]) -> bytes:
    return (json.dumps(msg, separators=(",", ":"), allow_nan=True) + "\n").encode()


def claim_stdout():
    """Keep the real stdout for the protocol and point fd 1 (Python's and C's) at stderr, so that
    stray output from the worker, a library or C code can never corrupt the protocol stream."""
    proto = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return proto


def serve(handlers: dict[str, Handler], proto=None) -> int:
    """Worker main loop: read requests from stdin, answer on the protocol stream, until shutdown."""
    proto = proto or claim_stdout()
    proto.write(encode({"id": 0, "ok": True, "payload": {"ready": True, "pid": os.getpid()}}))
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        req = json.loads(line)
        rid, kind = req.get("id"), req.get("kind")
        if kind == "shutdown":
            proto.write(encode({"id": rid, "ok": True, "payload": {}}))
            return 0
        handler = handlers.get(kind)
        try:
            if handler is None:
                raise Rejected("protocol", f"unknown request kind {kind!r}")
            reply = {"id": rid, "ok": True, "payload": handler(req.get("payload") or {})}
        except Rejected as e:
            reply = {"id": rid, "ok": False, "category": e.category, "message": str(e), "payload": e.payload}
        except WorkerFault as e:
            proto.write(encode({"id": rid, "ok": False, "category": e.category, "message": str(e),
                                "payload": e.payload, "poisoned": True}))
            sys.stderr.flush()
            os._exit(EXIT_POISONED)
        except Exception as e:  # a bug in the worker: report it, keep serving
            reply = {"id": rid, "ok": False, "category": "internal", "message": f"{type(e).__name__}: {e}",
                     "payload": {"traceback": traceback.format_exc()}}
        proto.write(encode(reply))
    return 0
