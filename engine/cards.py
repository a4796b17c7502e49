"""Operator cards: one runtime-compatible variant of an ATen op as a model really calls it.

One record, `OperatorCard`, travels from capture through the store, the proposers, the run and the
exporter. The lane's worker needs less (and gets it over a pipe): `CardRef`, made by `OperatorCard.ref`.
A store row becomes a card through `card_from_row` and nowhere else.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class CardRef:
    """What a lane's worker needs to verify candidates for a card: its signature and its samples' paths."""

    card_id: str
    op: str
    signature: dict[str, Any]
    outputs: list[dict[str, Any]]
    bytes: int
    samples: list[str]  # absolute paths of the sample files


@dataclass(frozen=True)
class OperatorCard:
    """An ATen overload plus the exact signature of its arguments, with what the capture measured.

    `calls` counts calls per forward of the full model (shrunk layers scaled by multiplicity);
    `share` is the card's fraction of the captured op time (measured during capture on the capture
    device); `bytes` is the minimum traffic of one call. `eager_us` and `roofline_us` are measured by
    a GPU lane, which times eager properly, and stored on the card by the run; so are the two references
    beside eager, timed the same way: `compile_us`, the card's eager under torch.compile (Inductor) alone
    (`compile_note` says why there is none, where it was tried), and `copy_us`, the lane's own device copy
    of `bytes` (what a memory-bound kernel for the card could at best take on that GPU). The op's tolerance
    is not a card field: it is a fact of the op family and dtype (`engine.verify.tolerance`).
    """

    card_id: str
    op: str                                   # 'aten::native_group_norm'
    signature: dict[str, Any]                 # engine.capture.signature.signature_of() form
    signature_text: str = ""
    outputs: list[dict[str, Any]] = field(default_factory=list)  # eager's outputs: dtype, shape, stride
    calls: int = 1
    share: float = 0.0
    bytes: int = 0
    eager_us: float | None = None
    roofline_us: float | None = None
    compile_us: float | None = None
    copy_us: float | None = None
    compile_note: str | None = None           # "no compile reference (reason)" where one was tried and failed
    compile_untried: bool = False             # no compile reference because the run's budget for them was spent
    captured_calls: int = 0
    module_paths: dict[str, int] = field(default_factory=dict)
    capture_us: float = 0.0
    samples: int = 0                          # how many samples the capture wrote
    output_varies: bool = False
    # A chain card's (op `kforge::chain`) facts beyond its signature: "kind" ('module' or 'pattern'),
    # "module_class", "modules" (the module paths it replaces, for a module chain), "members" (the
    # member calls' card ids in order), "ops". Outside the signature, so the card id is the same per kind.
    chain: dict[str, Any] | None = None

    def ref(self, sample_paths: Sequence[str]) -> CardRef:
        """The lane's reference to this card, with the absolute paths of its sample files."""
        return CardRef(self.card_id, self.op, self.signature, self.outputs, self.bytes, list(sample_paths))

    def row(self) -> dict[str, Any]:
        """The card as the store's `cards` table holds it (without the capture id)."""
        return {
            "card_id": self.card_id, "op": self.op, "signature": self.signature,
            "signature_text": self.signature_text, "calls": self.calls, "share": self.share,
            "bytes": self.bytes, "module_paths": self.module_paths, "captured_calls": self.captured_calls,
            "capture_us": self.capture_us, "outputs": self.outputs, "output_varies": self.output_varies,
            # JSON text: the store's `cards.chain` column (schema v4) is TEXT, NULL for an op card.
            "chain": None if self.chain is None else json.dumps(self.chain, sort_keys=True, separators=(",", ":")),
        }

    def to_json(self) -> dict[str, Any]:
        """The card as the CLI's `--json` prints it (DESIGN.md minimum shape plus details)."""
        return {
            "id": self.card_id, "op": self.op, "signature": self.signature_text, "calls": self.calls,
            "share": round(self.share, 6), "bytes": self.bytes, "captured_calls": self.captured_calls,
            "capture_us": round(self.capture_us, 3), "module_paths": self.module_paths,
            "outputs": self.outputs, "samples": self.samples, "output_varies": self.output_varies,
            "eager_us": self.eager_us, "roofline_us": self.roofline_us, "compile_us": self.compile_us,
            "copy_us": self.copy_us, "compile_note": self.compile_note, "args": self.signature["args"],
            "aliases": self.signature["aliases"], "chain": self.chain,
        }


def card_from_row(row: Mapping[str, Any]) -> OperatorCard:
    """The card a store row (`Store.get_cards`) or a script's dict with the same keys describes."""
    return OperatorCard(
        card_id=row["card_id"], op=row["op"], signature=row["signature"],
        signature_text=row.get("signature_text") or "", outputs=list(row.get("outputs") or []),
        calls=int(row.get("calls") or 1), share=float(row.get("share") or 0.0), bytes=int(row.get("bytes") or 0),
        eager_us=row.get("eager_us"), roofline_us=row.get("roofline_us"),
        compile_us=row.get("compile_us"), copy_us=row.get("copy_us"), compile_note=compile_note(row.get("ref_stats")),
        compile_untried=compile_untried(row.get("ref_stats")),
        captured_calls=int(row.get("captured_calls") or 0), module_paths=dict(row.get("module_paths") or {}),
        capture_us=float(row.get("capture_us") or 0.0), samples=_count(row.get("samples")),
        output_varies=bool(row.get("output_varies")), chain=_chain(row.get("chain")),
    )


def _compile_stats(ref_stats: Any) -> Mapping[str, Any]:
    """The torch.compile part of a card's ref_stats (the store's JSON text, or a dict); {} where none."""
    if isinstance(ref_stats, str):
        try:
            ref_stats = json.loads(ref_stats)
        except ValueError:
            return {}
    got = (ref_stats or {}).get("compile") if isinstance(ref_stats, Mapping) else None
    return got if isinstance(got, Mapping) else {}


def compile_note(ref_stats: Any) -> str | None:
    """"no compile reference (reason)" where a card's ref_stats (the store's JSON) record a failed try."""
    err = _compile_stats(ref_stats).get("error")
    return f"no compile reference ({err})" if err else None


def compile_untried(ref_stats: Any) -> bool:
    """Whether a card's torch.compile reference was never tried: its run's budget for them was spent first (a later
    run, or the run resumed, times it where its own budget allows)."""
    return bool(_compile_stats(ref_stats).get("untried"))


def copy_fraction(us: float | None, copy_us: float | None) -> float | None:
    """A kernel's time as a multiple of the lane's copy of the card's bytes (1.0: as fast as a copy)."""
    return us / copy_us if us and copy_us else None


def _chain(value: Any) -> dict[str, Any] | None:
    """A row's chain facts: JSON text (the store), a dict (scripts), or absent (an op card)."""
    if value is None or value == "":
        return None
    return dict(json.loads(value) if isinstance(value, str) else value)


def _count(samples: Any) -> int:
    """A row's samples: a count, or the list of their files (scripts and the exporter pass paths)."""
    if isinstance(samples, (list, tuple)):
        return len(samples)
    return int(samples or 0)


class SharedCard(Protocol):
    """What counting shares needs of a card: an OperatorCard, or a row that has these fields."""

    card_id: str
    calls: int | float
    share: float
    chain: dict[str, Any] | None


def chain_cover(cards: Iterable[SharedCard]) -> dict[str, dict[str, float]]:
    """Which part of each op card's share its chain cards' calls are: {op card id: {chain card id: share}}.

    A chain's calls are also its members' op cards' calls, so the two shares overlap. A chain card of n
    calls holds, of a member card of N calls, k·n of them (k: how often the card is a member of one
    instance, the same in every instance); the calls of one card have one signature, so they are that
    fraction of its share."""
    cards = list(cards)
    by_id = {c.card_id: c for c in cards if c.chain is None}
    cover: dict[str, dict[str, float]] = {}
    for chain in (c for c in cards if c.chain is not None):
        members = chain.chain.get("members") or []
        for cid in dict.fromkeys(members):
            op = by_id.get(cid)
            if op is None or op.calls <= 0:
                continue
            held = min(1.0, members.count(cid) * max(chain.calls, 0) / op.calls)
            cover.setdefault(cid, {})[chain.card_id] = held * op.share
    return cover


def compile_in_context(cards: Iterable[Any]) -> dict[str, list[dict[str, Any]]]:
    """Inductor's code for an op card in its context: torch.compile fuses an op with the memory-bound ops
    around it, and those are the chain cards that hold its calls. Per op card, each such chain whose
    compile reference was measured: {"chain": id, "ops": [...], "compile_us": µs of the whole chain under
    torch.compile, "held": the fraction of the op card's calls in it}, largest fraction first."""
    cards = list(cards)
    by_id = {c.card_id: c for c in cards}
    out: dict[str, list[dict[str, Any]]] = {}
    for cid, held in chain_cover(cards).items():
        op = by_id[cid]
        rows = []
        for chain_id, share in held.items():
            chain = by_id[chain_id]
            if getattr(chain, "compile_us", None) and op.share > 0:
                rows.append({"chain": chain_id, "ops": chain_ops(chain.chain, getattr(chain, "signature_text", "")
                                                                 or getattr(chain, "signature", "")),
                             "compile_us": chain.compile_us, "held": min(1.0, share / op.share)})
        if rows:
            out[cid] = sorted(rows, key=lambda r: -r["held"])
    return out


def model_speedup(cards: Iterable[SharedCard], speedups: Mapping[str, float]) -> float:
    """Amdahl's law over the op cards' shares with every call counted once: a chain's calls run at the
    better of the chain card's speedup and their own cards' (`speedups`, by card id; 1 where absent)."""
    cards = list(cards)
    cover = chain_cover(cards)

    def gain(cid: str) -> float:
        return max(1.0, speedups.get(cid, 1.0))

    total = left = 0.0
    by_chain: dict[str, list[tuple[str, float]]] = {}
    for c in cards:
        if c.chain is not None:
            continue
        held = cover.get(c.card_id, {})
        covered = min(c.share, sum(held.values()))
        total += c.share
        left += (c.share - covered) / gain(c.card_id)
        scale = covered / sum(held.values()) if covered > 0 else 0.0  # overlapping chains: never over the share
        for chain_id, s in held.items():
            by_chain.setdefault(chain_id, []).append((c.card_id, s * scale))
    for chain_id, members in by_chain.items():
        own = sum(s for _, s in members)
        left += min(own / gain(chain_id), sum(s / gain(cid) for cid, s in members))
    return total / left if left > 0 else 1.0


def chain_ops(chain: Mapping[str, Any] | None, signature_text: str = "") -> list[str]:
    """A chain card's member ops in order, views left out (`_to_copy`, `pow`, …): from its chain facts,
    else from its signature text (`chain[_to_copy pow …] in0 …`)."""
    ops = (chain or {}).get("ops")
    if ops:
        return [str(o) for o in ops]
    if signature_text.startswith("chain[") and "]" in signature_text:
        return signature_text[len("chain["):signature_text.index("]")].split()
    return []


def chain_label(chain: Mapping[str, Any] | None, signature_text: str = "") -> str:
    """`chain: _to_copy → pow → mean → add → rsqrt → mul …`: what a chain card is, in one line."""
    return "chain: " + (" → ".join(chain_ops(chain, signature_text)) or "?")


def chain_inputs(signature_text: str) -> str:
    """A chain card's signature text without its member list: its inputs (`in0 bf16[2,8,1536] in1 …`)."""
    if signature_text.startswith("chain[") and "] " in signature_text:
        return signature_text[signature_text.index("] ") + 2:]
    return signature_text


def chain_dispatch(kind: str | None, module_class: str | None = None, paths: Sequence[str] = ()) -> str:
    """Which dispatch serves a chain card: a module card replaces module instances' forward in eager
    (`cast.enabled(model)`); a pattern card is replaced inside compiled graphs (`cast.compile(model)`)."""
    if kind == "module":
        paths = list(paths)
        where = f" at {paths[0]}" + (f" and {len(paths) - 1} more" if len(paths) > 1 else "") if paths else ""
        return f"module card: {module_class or 'module'}{where}, eager (cast.enabled)"
    return "pattern card: under torch.compile (cast.compile)"


def chain_card_dispatch(chain: Mapping[str, Any] | None) -> str:
    """`chain_dispatch` of a chain card's facts (`OperatorCard.chain`)."""
    chain = chain or {}
    return chain_dispatch(chain.get("kind"), chain.get("module_class"), chain.get("modules") or ())


LANE_NAMESPACES = ("aten", "kforge")   # what a lane worker resolves without the model's own code


def foreign_op(op: str, signature: Mapping[str, Any] | None = None) -> str | None:
    """Why the lane cannot run a card, or None: its op (or a chain member's) is a custom op, registered by
    the model's code or another library (`torch.library`, `torchvision::nms`), which the lane's worker does
    not import. Such a card is shown, never searched."""
    names = [op, *(str(n.get("op", "")) for n in ((signature or {}).get("chain") or {}).get("nodes", []))]
    other = next((n for n in names if "::" in n and n.split("::", 1)[0] not in LANE_NAMESPACES), None)
    if other is None:
        return None
    return (f"custom op {other.split('.', 1)[0]}: registered by the model's code or another library, which "
            "the lane does not load; only PyTorch's own (aten) ops are searched")


def card_selected(op: str, chain: Mapping[str, Any] | None, signature_text: str, pattern: str | None) -> bool:
    """Whether a card is searched under `run --ops PATTERN` (a regular expression, searched): its op
    (`aten::native_group_norm`, `kforge::chain`) or, for a chain card, one of its member ops or its kind
    ('chain', 'module', 'pattern'). No pattern: every card."""
    import re

    if not pattern:
        return True
    rx = re.compile(pattern)
    names = [op, *chain_ops(chain, signature_text), "chain" if op == "kforge::chain" else ""]
    if chain and chain.get("kind"):
        names.append(str(chain["kind"]))
    return any(rx.search(n) for n in names if n)


# ---- derived cards: what call a card stands for, and a hidden call's share -----------------------------------


def call_of(op: str, signature: Mapping[str, Any]) -> str:
    """The call a card stands for, whatever card it was derived from: its op and signature without what names
    the card it came from (`twin_of`: a channels-last twin; `hidden_in`: a call made inside another's kernel;
    `folded_from`: a chain with a convolution's bias add in front). Two cards of one call would share a cast's
    guard key, and a cast serves only one of them."""
    return json.dumps([op, {k: v for k, v in signature.items() if k not in ("twin_of", "hidden_in", "folded_from")}],
                      sort_keys=True)


def hidden_makers(signature: Any) -> list[str]:
    """The ids of every card whose call makes this hidden call (engine.capture.hidden; the first, whose samples
    it shares, is `hidden_in.card`), or [] for any other card."""
    h = signature.get("hidden_in") if isinstance(signature, Mapping) else None
    if not isinstance(h, Mapping):
        return []
    return list(h.get("cards") or [h["card"]])


def hidden_part(eager_us: float | None, makers: Sequence[tuple[float, float | None]]) -> float | None:
    """A hidden call's share of the model: over its makers' (share, captured µs per call), each share times the
    call's eager µs over that maker's captured µs, at most the share. None until eager was timed for it or where
    a maker's captured time is not known (its makers' shares, an upper bound, stand then)."""
    if not eager_us or not makers or not all(us for _, us in makers):
        return None
    return sum(share * min(1.0, eager_us / us) for share, us in makers if us)
