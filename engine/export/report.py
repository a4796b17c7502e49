"""The human-readable side of a cast: `report.md` inside the file and the `audit` table."""

from __future__ import annotations

from typing import Any

from engine.capture.module_binding import SUBTREE
from engine.cards import chain_dispatch, chain_inputs, chain_label, copy_fraction
from engine.cast.format import CHAIN_OP, legacy_targets_text
from engine.outcomes import faster_with_confidence


def _ci(ev: dict[str, Any] | None) -> str:
    if not ev or ev.get("speedup") is None:
        return "–"
    ci = ev.get("speedup_ci") or [None, None]
    if None in ci:  # a manifest may hold [low, null] (format.MANIFEST_SHAPE): no interval to show
        return f"{ev['speedup']:.2f}×"
    return f"{ev['speedup']:.2f}× ({ci[0]:.2f}–{ci[1]:.2f})"


def chain_view(v: dict[str, Any]) -> dict[str, str] | None:
    """A chain variant as a reader wants it: its members (`chain: _to_copy → pow → …`), which dispatch serves
    it (a module card's class and paths, eager; a pattern card under torch.compile) and its inputs."""
    if v.get("op") != CHAIN_OP:
        return None
    chain, module = v.get("chain") or {}, v.get("module") or {}
    kind = "module" if module else chain.get("kind", "pattern")
    text = v.get("signature_text") or ""
    out = {"label": chain_label(chain, text), "dispatch": chain_dispatch(kind, module.get("class"),
                                                                         module.get("paths") or ()),
           "inputs": chain_inputs(text)}
    if module and module.get("returns") != "output":
        # a cast exported before captures checked that each proven forward returned the chain's output itself
        out["returns"] = ("not checked against the chain's output (the cast predates that check): a module whose "
                          "forward returns more (a tuple, a dict) would get that tensor alone; export it again from "
                          "a new capture")
    if module and "held" not in module:
        # a cast exported before captures recorded what each proven instance held (a config it reads at each call)
        out["held"] = ("not compared with the proof's (the cast predates that record): a model built with another "
                       "config is served as the proven one; export it again from a new capture")
    if module and not any(SUBTREE in s for s in module.get("states") or ()):
        # a cast written before they were recorded, or a module whose own attributes are not plain values
        out["submodules"] = ("not compared with the proof's (the cast records none): a module of its class "
                             "whose children differ is served too")
    return out


def _us(v: Any) -> str:
    return "–" if v is None else f"{v:.1f}"


def _output_clause(check: dict[str, Any]) -> str:
    """How the model's output compared with eager's, or why that comparison is no evidence."""
    if check.get("degenerate_eager"):
        from engine.export.e2e import eager_caveat

        return f"; {eager_caveat(check['degenerate_eager'])} (a cast that broke the model could agree with it)"
    if check.get("rel_l2_err") is None:
        return ""
    return f"; the model's output moved by {check['rel_l2_err']:.1e} (relative L2) against eager" + _accuracy(check)


def _accuracy(check: dict[str, Any]) -> str:
    """The accuracy the whole-model check judged: the output's distance from the model run in a wider format."""
    if not check.get("reference") or check.get("reference_err") is None:
        return ""
    return (f", {check['reference_err']:.1e} from the model run in {check['reference']} "
            f"({check['reference_err_without']:.1e} without the cast)")


def model_checks_of(source: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The whole-model check per target (eager, cuda-graphs, compile[:MODE]); a cast written before targets
    has one check under `model_check`, named by its mode."""
    checks = source.get("model_checks")
    if isinstance(checks, dict) and checks:
        return {t: c for t, c in checks.items() if isinstance(c, dict)}
    one = source.get("model_check")
    if isinstance(one, dict) and one.get("mode") not in (None, "none", "failed"):
        return {str(one["mode"]): one}
    return {}


def target_check_text(check: dict[str, Any]) -> str:
    """One target's whole-model result in words: eager ms -> cast ms, speedup with its CI, how far the
    output moved against eager (or why that says nothing), or why there is no number."""
    if check.get("refused"):
        return f"refused ({check['refused']})"
    if check.get("speedup") is None:
        return f"not measured ({check.get('reason') or check.get('mode') or 'no result'})"
    ci = check.get("speedup_ci") or [None, None]
    if None in ci:
        ci = [None, None]
    timed = check.get("eager_ms") is not None and check.get("cast_ms") is not None
    text = (f"{check['eager_ms']:.2f} -> {check['cast_ms']:.2f} ms, " if timed else "")
    text += f"{check['speedup']:.3f}×" + (f" (95% CI {ci[0]:.3f}–{ci[1]:.3f})" if ci[0] is not None else "")
    if check.get("degenerate_eager"):
        text += "; eager's own output is degenerate: agreement says nothing"
    elif check.get("rel_l2_err") is not None:
        text += f"; output vs eager {check['rel_l2_err']:.1e} (relative L2)" + _accuracy(check)
    if ci[0] is not None and not faster_with_confidence(ci):
        text += "; not faster with confidence"
    if check.get("replicate"):
        text += "; the lower of two processes' checks, each compiled afresh"
    elif check.get("one_process"):
        text += f"; {check['one_process']}"
    return text


def graph_routes_text(source: dict[str, Any]) -> str | None:
    """One line on the cast's graph routes (the export's graph-route check), or None where it did not run."""
    g = source.get("graph_routes")
    if not isinstance(g, dict):
        return None
    if g.get("classes"):
        return (f"graph routes: {', '.join(g['classes'])} replayed from CUDA graphs in eager, whole model "
                f"{_ci(g)} with them ({g.get('modules', '?')} module(s)); the cast routes them when installed with "
                "the model")
    why = g.get("error") or g.get("skipped") or g.get("interrupted") or "; ".join(g.get("tried") or []) or \
        "no class to try"
    return f"graph routes: none kept ({why})"


def layout_routes_text(source: dict[str, Any]) -> str | None:
    """One line on the cast's layout routes (the export's layout-route check), or None where it did not run."""
    g = source.get("layout_routes")
    if not isinstance(g, dict):
        return None
    if g.get("classes"):
        n = sum(len(v) for v in (g.get("signatures") or {}).values())
        drift = f", output rel. L2 {g['rel_l2_err']:.1e} from eager's" if g.get("rel_l2_err") is not None else ""
        gr = g.get("graphs") if isinstance(g.get("graphs"), dict) else {}
        targets = g.get("targets") or ["eager"]
        parts = [f"whole model {_ci(g)} in eager with them"] if "eager" in targets else []
        if gr.get("speedup") is not None:
            parts.append(f"under CUDA graphs {_ci(gr)}")
        if "eager" not in targets and g.get("eager_why"):
            parts.append(f"not in eager ({_ci(g)}: {g['eager_why']})")
        return (f"layout routes: {', '.join(g['classes'])} run channels-last in {' and '.join(targets)}, "
                f"{'; '.join(parts)} ({g.get('modules', '?')} module(s), {n} signature(s){drift}); the cast "
                "routes them when installed with the model")
    why = g.get("error") or g.get("interrupted") or "; ".join(g.get("tried") or []) or "no class to try"
    return f"layout routes: none kept ({why})"


def attention_routes_text(source: dict[str, Any]) -> str | None:
    """One line on the cast's attention routes (the export's attention-route check), or None where it did not
    run."""
    g = source.get("attention_routes")
    if not isinstance(g, dict):
        return None
    if g.get("targets"):
        sigs = [s for s in g.get("signatures") or [] if isinstance(s, dict)]
        shapes = ", ".join(f"{s.get('dtype')}{s.get('q')}" for s in sigs[:3]) + (" …" if len(sigs) > 3 else "")
        return (f"attention routes: {len(sigs)} SDPA signature(s) ({shapes}) computed in their math form under "
                f"{' and '.join(g['targets'])} ({'; '.join(g.get('tried') or [])})")
    why = g.get("error") or g.get("interrupted") or "; ".join(g.get("tried") or []) or "no attention to try"
    return f"attention routes: none kept ({why})"


def _target_lines(manifest: dict[str, Any]) -> list[str]:
    """report.md: what the cast was proven for, one row per target, and what a cast without targets does."""
    checks = model_checks_of(manifest.get("source") or {})
    routes = [t for t in (layout_routes_text(manifest.get("source") or {}),
                          graph_routes_text(manifest.get("source") or {}),
                          attention_routes_text(manifest.get("source") or {})) if t]
    said = [t[0].upper() + t[1:] + "." for t in routes]
    if not checks:  # a cast of routes alone, where no variant reached a whole-model check
        return ["## Routes", "", *said, ""] if said else []
    recorded = any("targets" in v for v in manifest["variants"])
    lines = ["## Targets", "",
             "What the whole-model check measured per target (the run's own model without and with the cast, "
             "alternated, fresh process). The loader runs a variant only under the targets whose check kept it."
             if recorded else
             f"This cast records {legacy_targets_text(manifest).replace('no targets recorded', 'no targets per variant')}.",
             "",
             "| target | whole model | variants kept |", "|---|---|---:|"]
    for t, c in checks.items():
        kept = sum(1 for v in manifest["variants"] if t in (v.get("targets") or []))
        lines.append(f"| {t} | {target_check_text(c)} | {kept if recorded else '–'} |")
    return lines + ([""] + said if said else []) + [""]


def _sanitizer_lines(ev: dict[str, Any] | None) -> list[str]:
    if not ev:
        return []
    return [f"- compute-sanitizer: {', '.join(ev.get('tools', []))} found no fault in its kernels "
            f"(run on {ev.get('inputs', 'its inputs')})"]


def copy_pct(us: float | None, copy_us: float | None) -> str:
    """A kernel's time as a percentage of the lane's copy of its card's bytes ("118%"), or "–"."""
    frac = copy_fraction(us, copy_us)
    return "–" if frac is None else f"{100 * frac:.0f}%"


def markdown_report(manifest: dict[str, Any], excluded: list[dict[str, Any]] | None = None) -> str:
    """What is in the cast, what it was proven on, and what was left out and why."""
    env = manifest["env"]
    src = manifest.get("source", {})
    lines = [f"# Kernel Forge cast — {src.get('model', 'model')}", "",
             f"Format {manifest['format_version']}, exported {manifest.get('created', '?')} from run "
             f"`{src.get('run', '?')}` (proposer {src.get('provider', '?')}).", "",
             f"Proven on **{env.get('gpu')}** ({env.get('arch')}), torch {env.get('torch')}, CUDA "
             f"{env.get('cuda')}, driver {env.get('driver')}, NVRTC {env.get('nvrtc')}. On another GPU arch "
             "or torch minor version the loader installs nothing and the model runs on PyTorch.", "",
             "Each variant runs only on calls whose arguments match its signature exactly (dtype, shape, "
             "strides, alignment, values); every other call goes to PyTorch's own kernel.", "",
             "| variant | op | signature | category | calls/fwd | eager µs | cast µs | confirmed speedup (95% CI) "
             "| lane speedup | torch.compile µs | % of copy |", "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for v in manifest["variants"]:
        conf = v["evidence"].get("confirmed") or {}
        lane = v["evidence"].get("lane") or {}
        cv = chain_view(v)
        op, sig = ((f"`{cv['label']}` ({cv['dispatch']})", f"`{cv['inputs']}`") if cv else
                   (f"`{v['op']}`", f"`{v.get('signature_text', '')}`"))
        lines.append(f"| {v['id']} | {op} | {sig} | {v['category']} | "
                     f"{v.get('calls', '–')} | {_us(conf.get('eager_us'))} | {_us(conf.get('cast_us'))} | "
                     f"{_ci(conf)} | {_ci(lane)} | {_us(lane.get('compile_us'))} | "
                     f"{copy_pct(lane.get('cast_us'), lane.get('copy_us'))} |")
    lines += ["", "Confirmed speedups are measured in a fresh process through the public op with the cast "
              "installed against the same op without it (L2 flushed before each call, calls alternated, "
              "bootstrap CI of the median ratio). A variant is included only if its lower bound is above 1 "
              "and the GPU time it saves exceeds the host time its dispatch adds.", "",
              "torch.compile µs is the card's op (or chain) compiled alone by torch.compile (Inductor) and timed "
              "in the lane as eager is; % of copy is the kernel's lane time as a percentage of the lane's own "
              "device copy of the bytes the card must move at least (100% is as fast as a copy); – where the "
              "run did not measure them.", ""]
    routers = sorted({str((v["evidence"].get("confirmed") or {}).get("router")) for v in manifest["variants"]}
                     - {"None"})
    if routers:
        names = {"c++": "C++", "python": "Python"}
        lines += [f"Confirmed with the {' and '.join(names.get(r, r) for r in routers)} dispatch router (`KFORGE_CAST_ROUTER`; where the C++ "
                  "router cannot be built the loader dispatches from Python, which adds host time per call).", ""]
    check = src.get("model_check") or {}
    if check.get("speedup") is not None:
        ci = check.get("speedup_ci") or [float("nan")] * 2
        mode = {"eager": "eager forwards", "cuda-graphs": "CUDA-graph replays"}.get(
            check.get("mode"), f"torch.compile ({str(check.get('mode')).partition(':')[2] or 'default'})")
        lines += [f"Whole-model check ({mode} of the run's own model, alternating, fresh process): "
                  f"{check.get('eager_ms', float('nan')):.2f} ms → {check.get('cast_ms', float('nan')):.2f} ms, "
                  f"{check['speedup']:.3f}× (95% CI {ci[0]:.3f}–{ci[1]:.3f})"
                  + _output_clause(check) + "."
                  + (" Not faster with confidence: each kernel was faster on its own, the model as a whole was "
                     "not measurably so." if not faster_with_confidence(ci) else ""), ""]
    elif check.get("mode") in ("none", "failed"):
        lines += [f"No whole-model check: {check.get('reason')}.", ""]
    lines += _target_lines(manifest)
    for v in manifest["variants"]:
        p = v["provenance"]
        cv = chain_view(v)
        lines += [f"## {v['id']} — `{cv['label'] if cv else v['op']}`", "",
                  *([f"- served by: {cv['dispatch']}", f"- inputs: `{cv['inputs']}`"] if cv else
                    [f"- signature: `{v.get('signature_text', '')}`"]),
                  *([f"- proven for: {', '.join(v['targets']) or 'no target'}"] if "targets" in v else []),
                  f"- kernels: {', '.join(v['kernels'])}; files: " +
                  ", ".join(f"`{f['path']}`" for f in v["files"].values()),
                  f"- tolerance: {', '.join(v.get('tolerance', [])) or '–'}",
                  *_sanitizer_lines(v["evidence"].get("sanitizer")),
                  f"- provenance: candidate `{p.get('candidate_id')}` by {p.get('proposer')}"
                  f"{' / ' + str(p.get('model_name')) if p.get('model_name') else ''}"
                  f"{', ' + str(p.get('intent')) if p.get('intent') else ''}", ""]
    if excluded:
        lines += ["## Left on PyTorch", "", "| card | op | why |", "|---|---|---|"]
        for e in excluded:
            lines.append(f"| {e.get('card_id', '')[:8]} | `{e.get('op', '')}` | {e.get('reason', '')} |")
        lines.append("")
    return "\n".join(lines)


def audit_document(manifest: dict[str, Any], problems: dict[str, str]) -> dict[str, Any]:
    """`audit --json`: {"format", "env", "variants": [{"op", "signature", "category", "speedup", …}]}."""
    out = []
    for v in manifest["variants"]:
        conf = v["evidence"].get("confirmed") or {}
        out.append({"id": v["id"], "op": v["op"], "signature": v.get("signature_text", ""),
                    "signature_full": v["signature"], "category": v["category"],
                    "speedup": conf.get("speedup"), "speedup_ci": conf.get("speedup_ci"),
                    "eager_us": conf.get("eager_us"), "cast_us": conf.get("cast_us"),
                    "evidence": v["evidence"], "provenance": v["provenance"], "kernels": v["kernels"],
                    "targets": v.get("targets"), "chain": v.get("chain"), "problem": problems.get(v["id"]),
                    **({"chain_view": cv} if (cv := chain_view(v)) else {})})
    return {"format": manifest["format_version"], "env": manifest["env"], "source": manifest.get("source", {}),
            "variants": out}


def compile_modes_without_variants(variants: list[dict[str, Any]]) -> list[str]:
    """The torch.compile modes (default, reduce-overhead, ...) no variant was proven for, where every variant
    records its targets (engine.cast.compose.nothing_under asks the same of a loaded cast, of its usable
    variants). Empty where some variant records none: where that one runs depends on the cast's one
    whole-model check (legacy_targets_text says it)."""
    from engine.cast.format import TARGET_NAMES

    if any(v.get("targets") is None for v in variants):
        return []
    held = {t for v in variants for t in v["targets"]}
    return [t.partition(":")[2] or "default" for t in TARGET_NAMES if t.startswith("compile") and t not in held]


def audit_text(doc: dict[str, Any], path: str) -> str:
    """The audit as a plain table for a terminal."""
    env = doc["env"]
    lines = [f"{path}: format {doc['format']}, {len(doc['variants'])} variant(s), proven on {env.get('gpu')} "
             f"({env.get('arch')}), torch {env.get('torch')}"]
    for target, mc in model_checks_of(doc.get("source") or {}).items():
        lines.append(f"  whole model, {target}: {target_check_text(mc)}")
    if (lt := layout_routes_text(doc.get("source") or {})) is not None:
        lines.append(f"  {lt}")
    if (g := graph_routes_text(doc.get("source") or {})) is not None:
        lines.append(f"  {g}")
    if (a := attention_routes_text(doc.get("source") or {})) is not None:
        lines.append(f"  {a}")
    if doc["variants"] and all(v.get("targets") is None for v in doc["variants"]):
        lines.append(f"  {legacy_targets_text(doc)}")
    elif (idle := compile_modes_without_variants(doc["variants"])):
        lines.append(f"  under torch.compile ({', '.join(idle)}): no variant proven, so cast.compile(model) is "
                     "torch.compile(model) itself there, one compile and nothing of the cast in it")
    for v in doc["variants"]:
        sp = _ci({"speedup": v["speedup"], "speedup_ci": v["speedup_ci"]})
        cv = v.get("chain_view")
        line = (f"  {v['id']:<14} {cv['label'] if cv else v['op']:<32} {v['category']:<12} {sp:<22} eager "
                f"{_us(v['eager_us'])} µs -> {_us(v['cast_us'])} µs  {cv['inputs'] if cv else v['signature']}")
        if cv:
            line += f"\n      served by: {cv['dispatch']}"
            if cv.get("submodules"):
                line += f"\n      submodules: {cv['submodules']}"
            if cv.get("returns"):
                line += f"\n      return value: {cv['returns']}"
            if cv.get("held"):
                line += f"\n      what it holds: {cv['held']}"
        if v.get("targets") is not None:
            line += f"\n      proven for: {', '.join(v['targets']) or 'no target'}"
        if v.get("verify"):
            line += f"\n      verify: {v['verify']}"
        if v.get("problem"):
            line += f"\n      problem: {v['problem']}"
        lines.append(line)
    return "\n".join(lines)
