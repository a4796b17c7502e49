"""The `kforge-tui` command line: one place for the whole CLI surface of DESIGN.md.

The engine never imports Textual: commands that open the TUI are handed in by `kforge_tui.cli`
as callables, so the headless commands (capture, run --no-tui, export, audit) stay UI-free.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from engine.errors import KforgeError, UsageError
from engine.progress import StageProgress, json_stdout, stderr_progress

TuiLauncher = Callable[[argparse.Namespace], int]

TUI_COMMANDS = ("compare", "demo", "serve")
COLOR_SYSTEMS = ("auto", "truecolor", "256", "standard", "none")


def _positive_number(what: str) -> Callable[[str], float]:
    """An argparse type: a finite number > 0, else a usage error that says so ("must be {what}, not ..."). NaN,
    inf and what overflows to inf (1e400) are refused: `--wall-time inf` was stored in the run's config as
    Infinity, which is not JSON."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, not {text!r}") from None
        if not 0 < value < math.inf:  # also NaN
            raise argparse.ArgumentTypeError(f"must be {what}, not {text}")
        return value

    return parse


_positive_float = _positive_number("a finite number of seconds > 0")
_positive_usd = _positive_number("a number of US dollars > 0, e.g. 5 or 2.50")


def _url(text: str) -> str:
    if not text.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(f"must be an http:// or https:// URL, e.g. http://localhost:8000/v1, "
                                         f"not {text!r}")
    return text


def _regex(text: str) -> str:
    """A regular expression (checked here, so a typo is a usage error before any work)."""
    import re

    try:
        re.compile(text)
    except re.error as e:
        raise argparse.ArgumentTypeError(f"not a regular expression ({e}): {text!r}") from None
    return text


def _whole(lo: int, hi: int | None, what: str) -> Callable[[str], int]:
    """An argparse type: an integer from lo to hi (no upper bound where hi is None), else a usage error that
    says so ("must be {what}, not ...")."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, not {text!r}") from None
        if value < lo or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"must be {what}, not {text}")
        return value

    return parse


_positive_int = _whole(1, None, "a whole number >= 1")
_count = _whole(0, None, "a whole number >= 0")
# A TCP port (0 would bind a port the OS picks, which the printed address would not name).
_port = _whole(1, 65535, "a port number from 1 to 65535")


def package_version() -> str:
    """The installed kernel-forge version, else the one in pyproject.toml next to the engine."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kernel-forge")
    except PackageNotFoundError:
        pass
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on 3.10 only
        import tomli as tomllib
    try:
        pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
        return str(tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown"


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad usage as one line with exit code 2 (no usage dump)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


def _add_common(p: argparse.ArgumentParser, top: bool = False) -> None:
    # Subcommands must not reset what was given before the subcommand name (argparse applies a
    # subparser's defaults over the parent's values), hence SUPPRESS below the top level.
    default = None if top else argparse.SUPPRESS
    p.add_argument("--workspace", metavar="DIR", default=default,
                   help="workspace folder (default: $KFORGE_HOME, else .kforge/ in the current directory)")
    p.add_argument("--debug", action="store_true", default=False if top else argparse.SUPPRESS,
                   help="show tracebacks on errors")


def _add_tui(p: argparse.ArgumentParser, top: bool = False) -> None:
    """Options of the commands that open the TUI (top level, run, demo, compare, serve)."""
    default = None if top else argparse.SUPPRESS
    p.add_argument("--theme", default=default, metavar="NAME",
                   help="kforge-dark (default), kforge-light, kforge-high-contrast, or any Textual theme")
    p.add_argument("--color-system", choices=COLOR_SYSTEMS, default=default,
                   help="terminal colours (e.g. 256 for older terminals; default: auto)")
    p.add_argument("--keymap", metavar="FILE", default=default,
                   help="TOML file with a [keymap] table of binding id = keys (default ~/.config/kforge/tui.toml)")
    p.add_argument("--refresh", type=_positive_float, metavar="S", default=default,
                   help="seconds between TUI refreshes (default 1)")
    p.add_argument("--run", metavar="RUN", default=default, help="open this run instead of the latest")


def _command(sub: argparse._SubParsersAction, name: str, summary: str) -> argparse.ArgumentParser:
    """A subcommand whose own --help opens with the line that `kforge-tui --help` lists it by."""
    return sub.add_parser(name, help=summary, description=summary[0].upper() + summary[1:] + ".")


def build_parser() -> argparse.ArgumentParser:
    """The full CLI surface of DESIGN.md."""
    parser = _Parser(prog="kforge-tui", description=(
        "Kernel Forge: capture the operators a PyTorch model runs, search for faster verified CUDA "
        "kernels, and ship them as a .cast package. Without a subcommand, opens the TUI on the "
        "workspace's latest run."))
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    _add_common(parser, top=True)
    _add_tui(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = _command(sub, "capture", "capture a model's operator cards and print them")
    p.add_argument("config", metavar="CONFIG", help="model config, e.g. configs/models/resnet50.toml")
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    p.add_argument("--small", action="store_true",
                   help="shrink batch and sequence (never widths) so capture runs on a CPU in seconds")
    p.add_argument("--device", choices=("cpu", "cuda"), help="where to build the model (default: cuda if present)")
    p.add_argument("--samples", type=_count, metavar="K", help="real input samples kept per card (default: config, 3)")
    _add_common(p)

    p = _command(sub, "run", "optimise a model's cards: search for faster verified kernels")
    p.add_argument("config", metavar="CONFIG", nargs="?", help="model config (not needed with --resume)")
    p.add_argument("--no-tui", action="store_true", help="run in the foreground with progress on stderr")
    p.add_argument("--provider", help="builtin, anthropic, openai, replay, or a name from configs/providers.toml "
                                      "(default: anthropic/openai when their key is set, else builtin)")
    p.add_argument("--replay-run", metavar="RUN",
                   help="with --provider replay: the run of this workspace whose answers are served again "
                        "(no LLM calls, no cost)")
    p.add_argument("--iterations", type=_positive_int, metavar="N", help="evaluations per card (default 50)")
    p.add_argument("--model", metavar="NAME", help="the LLM model the provider asks (overrides its config)")
    p.add_argument("--base-url", type=_url, metavar="URL",
                   help="the provider's endpoint, e.g. http://localhost:8000/v1 (overrides its config)")
    p.add_argument("--strategy", help="mcts (default), greedy or beam")
    p.add_argument("--wall-time", type=_positive_float, metavar="S",
                   help="stop after S seconds of the whole run: capture and eager timing count, and the "
                        "timing of each card's references (its copy, its torch.compile); the search gets the rest "
                        "and stops when the time is spent (a capture in progress is finished first)")
    p.add_argument("--max-cost", type=_positive_usd, metavar="USD",
                   help="stop the search once the provider's cost reaches USD (tokens at the config's prices)")
    p.add_argument("--max-tokens", type=_positive_int, metavar="N",
                   help="stop the search once N LLM tokens (input + output) are used")
    p.add_argument("--max-proposals", type=_positive_int, metavar="K", help="proposals in flight at once (default 4)")
    p.add_argument("--ops", type=_regex, metavar="REGEX",
                   help="search only the cards whose op, or one of whose chain's ops, matches REGEX "
                        "(e.g. 'chain' for chain cards, 'group_norm|softmax'); the others are skipped "
                        "and not timed (default: every card)")
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout at the end")
    p.add_argument("--no-compile-ref", action="store_true",
                   help="do not time each card's op under torch.compile beside eager (the torch.compile "
                        "reference; a dry run never times it)")
    p.add_argument("--compile-ref-timeout", type=_positive_float, metavar="S",
                   help="seconds one card's torch.compile reference may take, compile and timing (default 120)")
    p.add_argument("--dry-run", action="store_true", help="capture, propose and compile only (no GPU needed)")
    p.add_argument("--gpu", metavar="NAME",
                   help="with --dry-run: the GPU to prepare kernels for (" + ", ".join(_gpu_names()) + "; default h200)")
    p.add_argument("--ray", action="store_true",
                   help="lanes on a Ray cluster: one per GPU it offers (compile lanes with --dry-run); "
                        "needs pip install -e \".[ray]\"")
    p.add_argument("--ray-address", metavar="ADDRESS",
                   help="the cluster for --ray, as ray.init takes it (default: a local instance)")
    p.add_argument("--small", action="store_true", help="capture with the config's [small] sizes")
    p.add_argument("--resume", metavar="RUN", help="continue a run (also after a crash)")
    p.add_argument("--takeover", action="store_true",
                   help="with --resume: continue the run although its row names a process on another host, which "
                        "this one cannot check (that host rebooted, or the workspace was copied from it)")
    p.add_argument("--device", choices=("cpu", "cuda"),
                   help="where to capture the model (default: cuda if present)")
    _add_common(p)
    _add_tui(p)

    p = _command(sub, "export", "package a run's winners as a .cast file (confirmed on this GPU)")
    p.add_argument("run", metavar="RUN", nargs="?", help="run id (default: the workspace's latest run)")
    p.add_argument("--out", metavar="FILE.cast", help="where to write the cast")
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="check the whole model under CUDA-graph replay instead of eager forwards "
                        "(the same as --target cuda-graphs)")
    p.add_argument("--target", metavar="T[,T…]",
                   help="what the whole-model check measures, and so what each variant is proven for: eager, "
                        "cuda-graphs, compile, compile:max-autotune-no-cudagraphs, compile:reduce-overhead "
                        "(comma-separated), or all; default eager")
    p.add_argument("--also-arch", metavar="sm_XX[,…]",
                   help="also compile each kernel for these GPUs (e.g. sm_121 for a DGX Spark): shipped as "
                        "unproven cubins, used there after 'audit --verify' and load(..., unproven_ok=True)")
    p.add_argument("--no-model-check", action="store_true",
                   help="skip the whole-model check (per-variant confirmation only)")
    p.add_argument("--sanitize", action="store_true",
                   help="run compute-sanitizer (memcheck, racecheck, synccheck) on each confirmed variant's "
                        "samples and leave out any it finds a fault in")
    p.add_argument("--sanitize-timeout", type=_positive_float, metavar="S",
                   help="seconds per variant and sanitizer tool at most (default 300)")
    p.add_argument("--fresh", action="store_true",
                   help="confirm and check everything again: reuse none of the checkpoints that earlier exports "
                        "left in the workspace (export-checkpoints/)")
    p.add_argument("--graph-routes", action=argparse.BooleanOptionalAction, default=True,
                   help="after the eager check, try replaying the model's repeated modules (decoder layers, "
                        "blocks) from CUDA graphs and keep the first class that makes the whole model faster with "
                        "an output equal bit for bit (default: on; it takes up to two minutes; docs/chains.md)")
    p.add_argument("--layout-routes", action=argparse.BooleanOptionalAction, default=True,
                   help="where the model ran convolutions, also try running its convolutional modules "
                        "channels-last in eager and keep the first class that makes the whole model faster with "
                        "an output that agrees with eager's (default: on; up to two minutes; docs/cast.md)")
    _add_common(p)

    p = _command(sub, "audit", "show what a .cast file holds; --verify re-checks it on this GPU")
    p.add_argument("file", metavar="FILE.cast", help="the cast to show (what `kforge-tui export --out` wrote)")
    p.add_argument("--verify", action="store_true", help="re-check numerics and speed on the current GPU")
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    _add_common(p)

    p = _command(sub, "runs", "list the workspace's runs (newest first)")
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    _add_common(p)

    p = _command(sub, "prune", "what the workspace holds on disk; --delete removes the capture samples "
                                     "no run needs (docs/cli.md)")
    p.add_argument("--delete", action="store_true",
                   help="remove what the listing marks 'remove' (without it, prune only shows what it would remove)")
    p.add_argument("--run-captures", action="store_true",
                   help="also the samples of captures that finished or stopped runs used: those runs still list, "
                        "compare and export (on inputs synthesised from each card's signature) but cannot be resumed")
    p.add_argument("--newest", action="store_true",
                   help="also the samples of each model's newest capture (the next run of that config captures again)")
    p.add_argument("--capture", metavar="ID", action="append",
                   help="only this capture's samples (an id or unique prefix; may be given more than once)")
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    _add_common(p)

    p = _command(sub, "compare", "runs or providers side by side (the TUI; text when not a terminal)")
    p.add_argument("runs", metavar="RUN", nargs="+", help="run ids (or unique prefixes)")
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout (no TUI)")
    p.add_argument("--plain", action="store_true",
                   help="print a plain-text table (no TUI; the default when stdout is not a terminal)")
    _add_common(p)
    _add_tui(p)

    p = _command(sub, "demo", "the TUI on a small recorded run shipped with the package (no GPU needed)")
    _add_common(p)
    _add_tui(p)

    p = _command(sub, "serve", "serve the TUI to a browser on localhost (reach it through an SSH tunnel)")
    p.add_argument("--port", type=_port, default=8000, help="localhost port (default 8000)")
    p.add_argument("--host", default="127.0.0.1",
                   help="loopback address to bind (default 127.0.0.1; other hosts are refused: use an SSH tunnel)")
    p.add_argument("--demo", action="store_true", help="serve the demo run instead of the workspace")
    _add_common(p)
    _add_tui(p)
    return parser


def _gpu_names() -> list[str]:
    from engine.propose.hardware_profiles import profile_names

    return profile_names()


def run_argv(args: argparse.Namespace) -> list[str]:
    """A parsed `run` as argv again, from the `run` parser's own options: CONFIG and every engine option given.

    Left out, for the caller to set: the TUI's own options (they shape the viewer, not the run),
    --workspace and --no-tui. A run option added to build_parser is carried with no change here.
    """
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    run = sub.choices["run"]
    viewer = argparse.ArgumentParser(add_help=False)
    _add_tui(viewer)
    left_out = {a.dest for a in viewer._actions} | {"workspace", "no_tui", "help"}
    argv: list[str] = []
    for action in run._actions:
        if action.dest in left_out:
            continue
        value = getattr(args, action.dest, None)
        if not action.option_strings:  # CONFIG
            argv += [] if value is None else [str(value)]
        elif action.nargs == 0:  # a flag: given when its value is not the default (--debug's default is SUPPRESS)
            argv += [action.option_strings[-1]] if value not in (None, False) and value != action.default else []
        elif value is not None and value is not argparse.SUPPRESS:
            argv += [action.option_strings[-1], str(value)]
    return argv


def cmd_export(args: argparse.Namespace) -> int:
    """`kforge-tui export [RUN] --out FILE.cast`: confirm the run's winners here and write the cast."""
    if not args.out:
        raise UsageError("export: give --out FILE.cast")
    out = Path(args.out)
    if not out.parent.is_dir():
        raise UsageError(f"export --out {args.out}: folder {out.parent} does not exist")
    from engine.export.package import ExportPartial
    from engine.run.interrupt import sigterm_raises

    # On a terminal the export is a stage updated in place; redirected, stderr keeps only errors and warnings.
    stages = StageProgress() if sys.stderr.isatty() else None
    partial = None
    try:
        with sigterm_raises():  # `timeout` and job schedulers stop it as Ctrl-C does: finished targets are kept
            result = _export(args, out, stages.sink("export") if stages else stderr_progress())
    except ExportPartial as e:  # the cast of the finished targets is written: shown as any cast, then why partial
        partial, result = e, e.result
    finally:
        if stages is not None:
            stages.close()
    for w in result.warnings:  # always, also redirected: the cast is written, but the user must know this
        print(f"kforge: warning: {w}", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps({"out": str(out), "included": result.included, "excluded": result.excluded,
                          "model_check": result.model_check, "model_checks": result.model_checks,
                          "warnings": result.warnings, "unchecked": result.unchecked,
                          **({"graph_routes": result.graph_routes} if result.graph_routes is not None else {}),
                          **({"layout_routes": result.layout_routes} if result.layout_routes is not None else {}),
                          **({"attention_routes": result.attention_routes}
                             if result.attention_routes is not None else {})},
                         separators=(",", ":"), default=str))
    else:
        print(f"wrote {out}: {len(result.included)} variant(s)")
        for v in result.included:
            ci = v.get("speedup_ci") or [float("nan")] * 2
            print(f"  {v['id']:<40} {v['op']:<32} {v['speedup']:.2f}x (95% CI {ci[0]:.2f}-{ci[1]:.2f})"
                  + (f"  proven for: {', '.join(v['targets'])}" if v.get("targets") else ""))
        for e in result.excluded:
            print(f"  left on PyTorch: {e['op']} {e['card_id'][:8]}: {e['reason']}")
        check = result.model_check or {}
        if result.model_checks:
            from engine.export.report import target_check_text

            for target, mc in result.model_checks.items():
                if isinstance(mc, dict):
                    print(f"whole model, {target}: {target_check_text(mc)}")
        elif check.get("speedup") is not None:
            ci = check.get("speedup_ci") or [float("nan")] * 2
            err = check.get("rel_l2_err")
            print(f"whole model ({check.get('mode')}): {check['speedup']:.3f}x (95% CI {ci[0]:.3f}-{ci[1]:.3f})"
                  + ("" if err is None else f"; output moved {err:.1e} (relative L2)"))
        if result.layout_routes is not None:
            from engine.export.report import layout_routes_text

            print(layout_routes_text({"layout_routes": result.layout_routes}))
        if result.graph_routes is not None:
            from engine.export.report import graph_routes_text

            print(graph_routes_text({"graph_routes": result.graph_routes}))
        if result.attention_routes is not None:
            from engine.export.report import attention_routes_text

            print(attention_routes_text({"attention_routes": result.attention_routes}))
    if partial is not None:
        print(f"{partial}: {_export_again(args, partial.run_id, out, partial.targets)}", file=sys.stderr, flush=True)
        return partial.exit_code
    return 0


def _export_again(args: argparse.Namespace, run_id: str, out: Path, targets: list[str]) -> str:
    """The command that finishes a partial export: the same export, its run named (a newer run in the workspace
    must not change what it exports), which reuses the checks that finished."""
    import shlex

    argv = ["kforge-tui", "export", run_id, "--workspace", str(_workspace(args)), "--out", str(out),
            "--target", ",".join(targets)]
    argv += ["--also-arch", args.also_arch] if args.also_arch else []
    argv += ["--sanitize"] if args.sanitize else []
    argv += ["--sanitize-timeout", f"{args.sanitize_timeout:g}"] if args.sanitize_timeout else []
    argv += [] if args.graph_routes else ["--no-graph-routes"]
    argv += [] if args.layout_routes else ["--no-layout-routes"]
    return shlex.join(argv + (["--json"] if args.json else []))


def _export(args: argparse.Namespace, out: Path, progress: Callable[[str], None]):  # noqa: ANN202
    from engine.export.package import export_run, parse_targets

    targets = parse_targets(args.target) if args.target else None
    archs = [a.strip() for a in (args.also_arch or "").split(",") if a.strip()]
    bad = [a for a in archs if not re.fullmatch(r"sm_\d{2,3}[af]?", a)]
    if bad:
        raise UsageError(f"--also-arch {args.also_arch}: {bad[0]!r} is not an arch like sm_121")
    return export_run(_export_workspace(args), args.run, out, progress=progress,
                      model_check=not args.no_model_check, cuda_graphs=args.cuda_graphs,
                      sanitize=args.sanitize, sanitize_timeout_s=args.sanitize_timeout, targets=targets,
                      also_archs=archs, fresh=args.fresh, graph_routes=args.graph_routes,
                      layout_routes=args.layout_routes)


def cmd_audit(args: argparse.Namespace) -> int:
    """`kforge-tui audit FILE.cast [--verify] [--json]`; a damaged file is bad input (exit 2)."""
    from engine.cast.format import CastError
    from engine.export.audit import audit, audit_json
    from engine.export.report import audit_text

    try:
        doc = audit(args.file, verify=args.verify)
    except CastError as e:
        raise UsageError(f"audit: {e}") from None
    if args.json:
        print(audit_json(doc))
    else:
        print(audit_text(doc, args.file))
    damaged = [f"{v['id']}: {v['problem']}" for v in doc["variants"] if v.get("problem")]
    if damaged:
        raise UsageError(f"audit: {args.file} is damaged: " + "; ".join(damaged))
    return 1 if args.verify and not all(v.get("verified_ok") for v in doc["variants"]) else 0


def _workspace(args: argparse.Namespace) -> Path:
    from engine.store import WorkspaceError, ensure_workspace, resolve_workspace

    try:
        return ensure_workspace(resolve_workspace(args.workspace))
    except WorkspaceError as e:
        raise UsageError(str(e)) from None


def _resume_workspace(args: argparse.Namespace) -> None:
    """`run --resume RUN` names a run of an existing workspace: where --workspace (or the default) holds none, say
    so before anything is made there (it left an empty workspace behind, then said 'no such run')."""
    from engine.store import db_path, resolve_workspace

    workspace = resolve_workspace(args.workspace)
    if not db_path(workspace).is_file():
        raise UsageError(f"--resume {args.resume}: no Kernel Forge workspace at {workspace}: give the --workspace DIR "
                         "the run was made in, or resume from the folder whose .kforge/ holds it")
    # A flag that would change what the run searches is refused here too: the TUI attaches to the run at once and
    # would show it idle while its detached engine exits with the refusal in a log.
    from engine.run.command import resumed_config
    from engine.store import open_readonly, read

    try:
        conn = open_readonly(db_path(workspace))
        try:
            run = read.run(conn, args.resume)
        finally:
            conn.close()
    except Exception:  # noqa: BLE001 - an unreadable store is said by the run itself, as before
        return
    if run is not None:
        resumed_config(args, run)
        # Said here too: the TUI attaches to the run at once, and would show the other process's search.
        from engine.run.report import running_elsewhere

        held = None if args.takeover else running_elsewhere(run, workspace)
        if held is not None:
            raise held


def _export_workspace(args: argparse.Namespace) -> Path:
    """The workspace an export reads, as it is: nothing is made there. A mistyped --workspace, or export run from
    another folder, is said by export_run and leaves no empty workspace behind. Export only reads the workspace
    before its checks, and a read-only one (another user's, an archived run) exports with a warning that it could
    not take the export's row (docs/cast.md); until 2026-12-06 export refused it before looking the run up."""
    from engine.store import resolve_workspace

    return resolve_workspace(args.workspace)


def _workspace_existing(args: argparse.Namespace) -> Path:
    """The workspace to read (never created here): a missing one is bad input."""
    from engine.store import db_path, resolve_workspace

    workspace = resolve_workspace(args.workspace)
    if not db_path(workspace).is_file():
        raise UsageError(f"no Kernel Forge workspace at {workspace}: start a run with 'kforge-tui run CONFIG' "
                         "or give --workspace DIR")
    return workspace


def load_user_config():  # noqa: ANN201 - re-exported for the TUI, which may import engine.cli only
    """The user config (engine.userconfig.load_user_config): providers, limits, theme, keymap."""
    from engine.userconfig import load_user_config as load

    return load()


def cmd_capture(args: argparse.Namespace) -> int:
    """`kforge-tui capture CONFIG`: capture cards, store them with samples, print them."""
    from engine.config import load_config

    config = load_config(args.config, small=args.small)
    workspace = _workspace(args)
    from engine.capture.store import capture_and_store
    from engine.run.interrupt import (
        Interrupted,
        Terminated,
        TerminatedStop,
        exit_on_next_sigint,
        sigterm_raises,
    )

    # On a terminal the capture is a stage updated in place, whose spinner and elapsed time move also while
    # one step says nothing for seconds (importing the model's library, filling gigabytes of weights);
    # redirected, stderr keeps only errors and warnings.
    with json_stdout(args.json):  # the progress display starts and stops inside: it restores what it found
        stages = StageProgress() if sys.stderr.isatty() else None
        try:
            with sigterm_raises():   # `timeout`, a job scheduler: stopped as by Ctrl-C, nothing half-written
                result = capture_and_store(config, args.device, workspace, samples=args.samples,
                                           progress=stages.sink("capture") if stages else stderr_progress())
            if stages is not None:
                stages.done("capture", f"{config.name}: {len(result.cards)} cards and {len(result.chains)} chain "
                                       f"cards, captured in {result.wall_s:.1f} s")
        except Terminated:
            raise TerminatedStop("terminated: capture stopped; nothing was kept") from None
        except KeyboardInterrupt:  # its samples were in a .partial-* folder, removed on the way out
            exit_on_next_sigint()
            raise Interrupted("interrupted: capture stopped; nothing was kept") from None
        finally:
            if stages is not None:
                stages.close()
    if args.json:
        print(json.dumps(result.to_json(), indent=None, separators=(",", ":")))
    else:
        from engine.capture.report import print_cards

        print_cards(result, workspace)
    return 0


def terminal_attached() -> bool:
    """Both ends are a terminal (KFORGE_FORCE_TUI=1 overrides, for tests that drive the app headless)."""
    if os.environ.get("KFORGE_FORCE_TUI") == "1":
        return True
    return sys.stdin.isatty() and sys.stdout.isatty()


# Exit code when stdout is closed early (`kforge-tui audit x.cast --json | head -c 10`): 128 + SIGPIPE,
# what a shell reports for `cat` or `git log` cut off the same way; the output was not all delivered.
EXIT_BROKEN_PIPE = 141


def _stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader has gone (poll reports an error on its write end)."""
    try:
        import select

        fd = sys.stdout.fileno()
        poller = select.poll()
    except (AttributeError, OSError, ValueError):  # no poll (Windows) or no real stdout: trust the error
        return True
    poller.register(fd, select.POLLOUT)
    return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))


def _quiet_broken_stdout() -> int:
    """Point stdout at /dev/null so the interpreter's exit flush cannot raise again; no traceback."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):
        pass
    return EXIT_BROKEN_PIPE


_EXIT_FREEZE: list[bool] = []


def _freeze_objects_at_exit() -> None:
    """Once per process: at exit, put every object then alive out of the cycle collector's reach. Otherwise
    the interpreter's teardown of torch's, transformers' and diffusers' modules runs cyclic collections over
    them: 1.3-1.7 s of a 13 s `capture --small` on a 2-core machine. Python promises no finalizer at exit,
    and nothing here waits for one (the store and sample files are closed before a command returns)."""
    if not _EXIT_FREEZE:
        import atexit
        import gc

        atexit.register(gc.freeze)
        _EXIT_FREEZE.append(True)


def main(argv: Sequence[str] | None = None, *, open_tui: TuiLauncher | None = None) -> int:
    """Parse and run; errors become one line on stderr and exit code 2 (input) or 1 (job).

    A closed stdout (the reader of a pipe quit early) ends quietly with EXIT_BROKEN_PIPE."""
    _freeze_objects_at_exit()
    try:
        code = _dispatch(list(sys.argv[1:] if argv is None else argv), open_tui)
        sys.stdout.flush()  # a closed pipe shows here, not later in the interpreter's exit flush
        return code
    except BrokenPipeError:
        return _quiet_broken_stdout()


def _damaged_database(args: argparse.Namespace | None, e: BaseException) -> KforgeError | None:
    """The one-line error (engine.store.unusable_database) for SQLite's word that the workspace database is damaged,
    whichever command's statement met it: the header can be intact and a later page scrambled (a torn write), which
    only a query reaching that page shows. None for anything else. Until 2026-12-06 only `runs` and `compare` said
    it; prune, capture, run, run --resume and export said "internal error: DatabaseError: ... malformed", exit 1."""
    import sqlite3

    if args is None or not isinstance(e, sqlite3.DatabaseError):
        return None
    from engine.store import db_path, is_corruption, resolve_workspace, unusable_database

    return unusable_database(db_path(resolve_workspace(args.workspace)), e) if is_corruption(e) else None


def _dispatch(argv: list[str], open_tui: TuiLauncher | None) -> int:
    debug = "--debug" in argv or os.environ.get("KFORGE_DEBUG") == "1"
    args = None
    try:
        args = build_parser().parse_args(argv)
        if args.version:
            print(f"kforge-tui {package_version()}")
            return 0
        if args.command == "capture":
            return cmd_capture(args)
        if args.command == "run":
            from engine.run.command import check_run_args, cmd_run

            check_run_args(args)  # bad input is exit 2 here, not in a detached engine's log
            if args.resume:  # a run to resume lives in a workspace: a mistyped --workspace must not make a new one
                _resume_workspace(args)
            if not args.no_tui:
                if open_tui is not None and terminal_attached():
                    return open_tui(args)  # engine detached in its own process, the TUI attached to it
                # A pipe, a cron job, a CI log: a full-screen app would write escape codes and never end.
                print("kforge: not a terminal; running headless (as with --no-tui)" if open_tui is not None
                      else "kforge: the TUI is not available here; running headless (--no-tui)", file=sys.stderr)
            args.argv_as_given = run_argv(args)  # the command a stopped run names to go on (engine.run can't import us)
            return cmd_run(args, _workspace(args))
        if args.command == "runs":
            from engine.run.report import cmd_runs

            return cmd_runs(args, _workspace_existing(args))
        if args.command == "prune":
            from engine.run.prune import cmd_prune

            return cmd_prune(args, _workspace_existing(args))
        if args.command == "compare" and (args.json or args.plain or not terminal_attached()):
            from engine.run.report import cmd_compare

            return cmd_compare(args, _workspace_existing(args))
        if args.command is None or args.command in TUI_COMMANDS:
            if open_tui is None:
                raise UsageError("kforge-tui: the TUI is not available in this entry point; "
                                 "use 'kforge-tui capture CONFIG' or 'kforge-tui run CONFIG --no-tui'")
            return open_tui(args)
        if args.command == "export":
            return cmd_export(args)
        if args.command == "audit":
            return cmd_audit(args)
        raise UsageError(f"kforge-tui: unknown command {args.command!r} (see kforge-tui --help)")
    except KforgeError as e:
        if debug:
            traceback.print_exc()
        # Ctrl-C or SIGTERM (engine.run.interrupt.Interrupted, exit 130 or 143) is not an error: its line says
        # what was kept.
        from engine.run.interrupt import Interrupted

        print(str(e) if isinstance(e, Interrupted) else f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt as e:
        from engine.run.interrupt import (
            EXIT_TERMINATED,
            Terminated,
            exit_on_next_sigint,
            stopped_before_the_run,
        )

        exit_on_next_sigint()
        terminated = isinstance(e, Terminated)
        if args is not None and args.command == "run" and not getattr(args, "run_began", False):
            # Stopped in its first seconds (importing torch): the line names the command to start it again.
            from engine.store import resolve_workspace

            args.argv_as_given = getattr(args, "argv_as_given", None) or run_argv(args)
            print(stopped_before_the_run(args, resolve_workspace(args.workspace),
                                         "terminated" if terminated else "interrupted"), file=sys.stderr)
            return EXIT_TERMINATED if terminated else 130
        if terminated:
            print("terminated (SIGTERM); nothing half-written was kept", file=sys.stderr)
            return EXIT_TERMINATED
        print("interrupted; nothing half-written was kept", file=sys.stderr)
        return 130
    except BrokenPipeError:
        if _stdout_closed():
            raise  # main ends quietly
        if debug:
            traceback.print_exc()
        print("error: internal error: BrokenPipeError (a pipe to a worker closed; rerun with --debug "
              "for the traceback)", file=sys.stderr)
        return 1
    except Exception as e:  # our own bug: still one line unless --debug
        if debug:
            traceback.print_exc()
        damaged = _damaged_database(args, e)
        if damaged is not None:
            print(f"error: {damaged}", file=sys.stderr)
            return damaged.exit_code
        print(f"error: internal error: {type(e).__name__}: {e} (rerun with --debug for the traceback)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
