"""Serve written answers to the LLM proposer over the Anthropic Messages wire protocol (no network, no LLM).

    python scripts/serve_answers.py tests/fixtures/recorded_answers/mlp_block.json [--port 0] \
        [--port-file F] [--log served.jsonl]

`POST /v1/messages` reads the card named in the prompt (`# Operator card `OP`` and the `Exact call`
line) and the task (a first kernel, a revision, or a repair), and answers with the next unused answer of
that card and kind from the fixture; a repair gets the answer written for the failed source it quotes.
When none is left it answers that it cannot help (no code), which the pipeline records as unusable.
The fixture's answers were written by an AI assistant acting as the model, and are labelled so in it; an
answer with its own `label` (one deliberately flawed, to exercise failure inspection) is served with that
label as a note after its prose, so the recorded reply says so too.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

FALLBACK_ID = "fallback"
FALLBACK_TEXT = ("I cannot help further with this card: I have no other kernel to offer for this task. "
                 "[scripts/serve_answers.py: no written answer is left for this card and task]")
NOTE_PREFIX = "scripts/serve_answers.py, from the fixture: this answer is "
_OP = re.compile(r"^# Operator card `([^`]+)`", re.M)
_SIGNATURE = re.compile(r"^Exact call \(your kernel handles only this one\): `([^`]*)`", re.M)
_FAILED_SOURCE = re.compile(r"^## Failed source\n```cuda\n(.*?)\n```\n", re.M | re.S)


def task_kind(prompt: str) -> str:
    """'repair', 'revise', 'followup' or 'fresh': which template of engine/propose/prompts the prompt used."""
    if "# Task: repair" in prompt:
        return "repair"
    if "# Task: revise a kernel" in prompt:
        return "revise"
    if "# Operator card `" not in prompt:
        return "followup"  # the follow-up asking for a missing launch spec quotes no card
    return "fresh"


def answer_text(answer: dict[str, Any]) -> str:
    """The reply as the model wrote it: short prose (and the fixture's label of a flawed answer), then the
    cuda block, then the toml block."""
    note = f"\n\n[{NOTE_PREFIX}{answer['label']}]" if answer.get("label") else ""
    return (f"{answer['prose'].strip()}{note}\n\n```cuda\n{answer['cuda'].rstrip()}\n```\n\n"
            f"```toml\n{answer['toml'].rstrip()}\n```\n")


@dataclass
class AnswerBook:
    """The fixture's answers by card, and which of them were served already."""

    cards: list[dict[str, Any]]
    label: str = ""
    used: set[tuple[int, str]] = field(default_factory=set)
    served: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def load(cls, path: str | Path) -> AnswerBook:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
        return cls(doc["cards"], doc.get("label", ""))

    def card_index(self, prompt: str) -> int | None:
        """The fixture card this prompt is for: same op and same exact-call text."""
        op, sig = _OP.search(prompt), _SIGNATURE.search(prompt)
        if op is None or sig is None:
            return None
        for i, card in enumerate(self.cards):
            if card["op"] == op.group(1) and card["signature"] == sig.group(1):
                return i
        return None

    def pick(self, prompt: str) -> tuple[str, str]:
        """(answer id, reply text) for one prompt; the fallback when no answer is left."""
        kind, i = task_kind(prompt), self.card_index(prompt)
        answer = None
        if i is not None:
            left = [a for a in self.cards[i]["answers"] if (i, a["id"]) not in self.used]
            # A first kernel and a revision are both whole kernels for the card: the search asks for either
            # (a dry run, which verifies nothing, asks only for first kernels), so each serves the other
            # once its own kind is used up. A repair only ever answers the failure it was written for.
            todo = [a for a in left if a["kind"] == kind]
            if kind in ("fresh", "revise"):
                todo += [a for a in left if a["kind"] in ("fresh", "revise") and a["kind"] != kind]
            if kind == "repair":
                failed = _FAILED_SOURCE.search(prompt)
                failed_src = failed.group(1).strip() if failed else None
                by_id = {a["id"]: a for a in self.cards[i]["answers"]}
                todo = [a for a in todo if a.get("repairs") in by_id
                        and by_id[a["repairs"]]["cuda"].strip() == failed_src]
            answer = todo[0] if todo else None
        card = self.cards[i] if i is not None else {}
        record = {"t": time.time(), "op": card.get("op"), "signature": card.get("signature"), "kind": kind,
                  "answer": answer["id"] if answer else FALLBACK_ID}
        self.served.append(record)
        if answer is None:
            return FALLBACK_ID, FALLBACK_TEXT
        self.used.add((i, answer["id"]))
        return answer["id"], answer_text(answer)


def _prompt_of(body: dict[str, Any]) -> str:
    """The last user turn's text (a string, or a list of content blocks)."""
    for m in reversed(body.get("messages") or []):
        if m.get("role") == "user":
            content = m.get("content")
            if isinstance(content, list):
                return "".join(b.get("text", "") for b in content if isinstance(b, dict))
            return str(content or "")
    return ""


def make_app(book: AnswerBook, log: Path | None = None) -> web.Application:
    """The aiohttp app: `POST /v1/messages` in the Anthropic Messages format."""
    ids = itertools.count(1)

    async def messages(request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            return web.json_response({"type": "error", "error": {"type": "invalid_request_error",
                                                                 "message": "body is not JSON"}}, status=400)
        prompt = _prompt_of(body)
        answer_id, text = book.pick(prompt)
        book.served[-1]["request"] = n = next(ids)
        if log is not None:
            with log.open("a", encoding="utf-8") as f:
                f.write(json.dumps(book.served[-1]) + "\n")
        print(f"serve_answers: #{n} {book.served[-1]['op']} {book.served[-1]['kind']} -> {answer_id}",
              file=sys.stderr, flush=True)
        return web.json_response({
            "id": f"msg_written{n:04d}", "type": "message", "role": "assistant",
            "model": body.get("model") or "written-answers",
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn", "stop_sequence": None,
            # Token counts as a tokenizer would roughly give them (4 characters a token); nothing is billed.
            "usage": {"input_tokens": len(prompt) // 4, "output_tokens": max(1, len(text) // 4),
                      "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
        }, headers={"request-id": f"req_written{n:04d}"})

    app = web.Application()
    app.router.add_post("/v1/messages", messages)
    return app


async def start(book: AnswerBook, port: int = 0, log: Path | None = None) -> tuple[web.AppRunner, int]:
    """Start serving on 127.0.0.1 (`port` 0: a free one); returns the runner (cleanup() stops it) and the port."""
    runner = web.AppRunner(make_app(book, log), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    return runner, runner.addresses[0][1]


async def _serve(args: argparse.Namespace) -> None:
    book = AnswerBook.load(args.fixture)
    runner, port = await start(book, args.port, args.log)
    print(f"serve_answers: http://127.0.0.1:{port} ({sum(len(c['answers']) for c in book.cards)} answers for "
          f"{len(book.cards)} cards; {book.label})", file=sys.stderr, flush=True)
    if args.port_file:  # written last: a reader that sees the port can connect
        tmp = args.port_file.with_suffix(".tmp")
        tmp.write_text(str(port))
        tmp.replace(args.port_file)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("fixture", type=Path, help="answers JSON (tests/fixtures/recorded_answers/*.json)")
    ap.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)")
    ap.add_argument("--port-file", type=Path, help="write the port here once serving")
    ap.add_argument("--log", type=Path, help="append one JSON line per request served")
    args = ap.parse_args()
    try:
        asyncio.run(_serve(args))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
