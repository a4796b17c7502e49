"""Compile results, and the diagnostics parsed out of NVRTC / nvcc / ptxas logs.

Formats seen with CUDA 13.0 (NVRTC and nvcc share the EDG front end, so the shape is the same):

    candidate.cu(12): error: identifier "x" is undefined
    candidate.cu(3): warning #549-D: variable "p" is used before its value is set
    /usr/local/cuda/include/cccl/cub/....cuh(61): error: ...   (an error inside a header)
        a[0] = x;            <- source excerpt and caret: kept as the diagnostic's context
               ^
    ptxas error   : Entry function 'k' uses too much shared data (0x445c0 bytes, 0xc000 max)
    ptxas application ptx input, line 29; error   : Arguments mismatch for instruction 'mov'   (NVRTC)
    ptxas /tmp/x/candidate.ptx, line 29; error   : Arguments mismatch for instruction 'mov'   (nvcc)
    nvcc fatal   : Unsupported gpu architecture 'compute_999'

A ptxas error at a PTX line (typically bad inline asm) is mapped back to the source line through the
PTX's `.loc` directives when the PTX is at hand (we always compile with -lineinfo).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from engine.errors import KforgeError

Severity = Literal["error", "warning", "remark"]


class CompilerUnavailable(KforgeError):
    """The requested compiler (NVRTC library or nvcc executable) cannot be found or loaded."""

    exit_code = 2


@dataclass(frozen=True)
class Diagnostic:
    """One compiler message. `line` is None for messages with no source position (ptxas, nvlink, nvcc)."""

    file: str
    line: int | None
    column: int | None
    severity: Severity
    message: str
    code: str | None = None
    context: str = ""  # the source excerpt + caret, or "detected during instantiation ..." lines

    def headline(self) -> str:
        """`file:line:col: severity[code]: message` on one line."""
        where = self.file
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        code = f" [{self.code}]" if self.code else ""
        return f"{where}: {self.severity}{code}: {self.message}"


@dataclass(frozen=True)
class CompileResult:
    """The outcome of one compile. `kernels` are the extern "C" __global__ entry points (launchable by name)."""

    ok: bool
    cubin: bytes | None
    ptx: str | None
    log: str
    diagnostics: tuple[Diagnostic, ...]
    arch: str
    compiler: str
    seconds: float
    source_hash: str
    kernels: tuple[str, ...]
    options: tuple[str, ...] = ()
    cached: bool = False

    @property
    def errors(self) -> tuple[Diagnostic, ...]:
        return tuple(d for d in self.diagnostics if d.severity == "error")

    @property
    def warnings(self) -> tuple[Diagnostic, ...]:
        return tuple(d for d in self.diagnostics if d.severity == "warning")

    def summary(self, limit: int = 8) -> str:
        """Short text of the diagnostics for an LLM repair prompt (see `summarize`)."""
        return summarize(self.diagnostics, limit)


# EDG front end: `file(line): sev: msg`, `file(line): sev #20-D: msg`; newer front ends may add a column
# as `file(line, col)` or `file(line):col`. Host-compiler (gcc) style `file:line:col: sev: msg` also occurs
# in nvcc logs when the host preprocessor fails.
_EDG = re.compile(
    r"^(?P<file>[^\s(][^(]*?)\((?P<line>\d+)(?:,\s*(?P<col1>\d+))?\)(?::(?P<col2>\d+))?:\s+"
    r"(?P<sev>catastrophic error|fatal error|error|warning|remark|note)"
    r"(?:\s+#(?P<code>[0-9]+(?:-[A-Z])?))?:\s*(?P<msg>.*)$"
)
_GCC = re.compile(
    r"^(?P<file>[^\s:][^:]*):(?P<line>\d+):(?:(?P<col>\d+):)?\s+"
    r"(?P<sev>fatal error|error|warning|note)(?: #(?P<code>\d+(?:-[A-Z])?))?:\s*(?P<msg>.*)$"
)
# ptxas at a PTX line: NVRTC says "ptxas application ptx input, line 29;", nvcc names the .ptx file.
_PTXAS_AT = re.compile(
    r"^ptxas\s+(?P<ptxfile>.+?),\s*line\s+(?P<line>\d+);\s*(?P<sev>error|warning|fatal|info)\s*:\s*(?P<msg>.*)$"
)
_TOOL = re.compile(
    r"^(?P<tool>ptxas|nvlink|nvcc|fatbinary|cicc|cudafe\+\+|nvrtc)\s+(?P<sev>fatal|error|warning|info)\s*:\s*(?P<msg>.*)$"
)
# Lines that are bookkeeping, not diagnostics.
_NOISE = re.compile(
    r"^(\d+ (catastrophic )?errors? detected in the compilation of .*"
    r"|(and )?\d+ catastrophic errors? detected in the compilation of .*"
    r"|Compilation terminated\.?"
    r"|Remark: The warnings can be suppressed with .*"
    r"|ptxas fatal\s*: Ptx assembly aborted due to errors"
    r"|# --error 0x[0-9a-f]+ --.*)$"
)
_LOC = re.compile(r"^\s*\.loc\s+(\d+)\s+(\d+)\s+(\d+)")
_FILE = re.compile(r'^\s*\.file\s+(\d+)\s+"([^"]*)"')


def _severity(word: str) -> Severity:
    word = word.lower()
    if "error" in word or word == "fatal":
        return "error"
    if word == "warning":
        return "warning"
    return "remark"


def parse_log(log: str, *, source_name: str | None = None, ptx: str | None = None) -> tuple[Diagnostic, ...]:
    """Parse an NVRTC or nvcc log into diagnostics, in log order.

    `source_name` renames the candidate file in messages (nvcc prints the temp-dir path it was given);
    `ptx` lets ptxas errors at a PTX line be mapped to the source line through `.loc`.
    """
    out: list[Diagnostic] = []
    ctx: list[str] = []
    current: dict | None = None

    def flush() -> None:
        nonlocal current, ctx
        if current is not None:
            while ctx and not ctx[-1].strip():
                ctx.pop()
            out.append(Diagnostic(**current, context="\n".join(ctx)))
        current, ctx = None, []

    def rename(path: str) -> str:
        path = path.strip()
        if source_name and (path == source_name or path.endswith("/" + source_name)):
            return source_name
        return path

    for raw in log.replace("\x00", "").splitlines():
        line = raw.rstrip()
        stripped = line.strip()
        if not stripped:
            # A blank line ends the excerpt of the current diagnostic.
            flush()
            continue
        if _NOISE.match(stripped):
            flush()
            continue
        m = _EDG.match(stripped)
        if m:
            flush()
            col = m.group("col1") or m.group("col2")
            current = dict(file=rename(m.group("file")), line=int(m.group("line")),
                           column=int(col) if col else None, severity=_severity(m.group("sev")),
                           message=m.group("msg").strip(), code=m.group("code"))
            continue
        m = _PTXAS_AT.match(stripped)
        if m:
            flush()
            if m.group("sev") == "info":
                continue
            current = _ptxas_at(m, ptx, source_name)
            continue
        m = _TOOL.match(stripped)
        if m:
            flush()
            if m.group("sev") == "info":
                continue
            current = dict(file=m.group("tool"), line=None, column=None, severity=_severity(m.group("sev")),
                           message=m.group("msg").strip(), code=None)
            continue
        m = _GCC.match(stripped)
        if m:
            flush()
            current = dict(file=rename(m.group("file")), line=int(m.group("line")),
                           column=int(m.group("col")) if m.group("col") else None,
                           severity=_severity(m.group("sev")), message=m.group("msg").strip(),
                           code=m.group("code"))
            continue
        if current is not None:
            ctx.append(line)
        # Other unattached text (ptxas info continuation lines, banners) is not a diagnostic.
    flush()
    return tuple(out)


def _ptxas_at(m: re.Match[str], ptx: str | None, source_name: str | None) -> dict:
    """A ptxas message at a PTX line: point it at the source line of the nearest preceding `.loc`."""
    ptx_line = int(m.group("line"))
    sev = _severity(m.group("sev"))
    msg = m.group("msg").strip()
    base = dict(file="ptxas", line=None, column=None, severity=sev, code=None,
                message=f"{msg} (PTX line {ptx_line})")
    if not ptx:
        return base
    lines = ptx.splitlines()
    if not 1 <= ptx_line <= len(lines):
        return base
    files = {}
    for text in lines:
        fm = _FILE.match(text)
        if fm:
            files[fm.group(1)] = fm.group(2)
    for i in range(ptx_line - 1, -1, -1):
        lm = _LOC.match(lines[i])
        if lm:
            path = files.get(lm.group(1), "")
            name = path.rsplit("/", 1)[-1]
            if source_name and name == source_name.rsplit("/", 1)[-1]:
                name = source_name
            col = int(lm.group(3))
            return dict(file=name or "ptxas", line=int(lm.group(2)), column=col or None, severity=sev,
                        code="ptxas", message=f"{msg} (in PTX: `{lines[ptx_line - 1].strip()}`)")
    return base


def summarize(diags: Iterable[Diagnostic], limit: int = 8, *, max_chars: int = 4000,
              context_lines: int = 4) -> str:
    """Short text for an LLM repair prompt: errors first (log order), then warnings; remarks dropped."""
    diags = list(diags)
    seen: set[tuple] = set()
    ordered: list[Diagnostic] = []
    for sev in ("error", "warning"):
        for d in diags:
            key = (d.file, d.line, d.message)
            if d.severity == sev and key not in seen:
                seen.add(key)
                ordered.append(d)
    if not ordered:
        return "no errors"
    parts: list[str] = []
    used = 0
    shown = 0
    for d in ordered[:limit]:
        block = d.headline()
        if d.context:
            ctx = [c for c in d.context.splitlines() if c.strip()][:context_lines]
            block += "\n" + "\n".join(ctx)
        if used + len(block) > max_chars and shown:
            break
        parts.append(block)
        used += len(block) + 1
        shown += 1
    rest = len(ordered) - shown
    if rest > 0:
        n_err = sum(1 for d in ordered[shown:] if d.severity == "error")
        parts.append(f"... and {rest} more ({n_err} errors)")
    return "\n".join(parts)


def failure(compiler: str, message: str, code: str) -> Diagnostic:
    """A diagnostic for a compile that produced no compiler log of its own (timeout, crash)."""
    return Diagnostic(file=compiler, line=None, column=None, severity="error", message=message, code=code)


# Diagnostics whose cause is the environment rather than the source: results carrying one are not cached.
TRANSIENT_CODES = frozenset({"timeout", "crash", "internal"})


def is_transient(diags: Sequence[Diagnostic]) -> bool:
    """True when a failure came from the environment (timeout, crashed worker), so must not be cached."""
    return any(d.code in TRANSIENT_CODES for d in diags)


__all__ = ["CompileResult", "CompilerUnavailable", "Diagnostic", "Severity", "failure", "is_transient",
           "parse_log", "summarize"]


# State a kernel keeps from call to call, and what tells it where or when it runs: the lane regenerates every input
# and buffer per call, so a candidate that remembers (a memo of earlier answers, a call counter) or reads the time
# or the shared memory it was given can tell verification, timing and a user's model apart (red team,
# 2026-12-06g: a memo a whole-model check rewards, a counter that turns wrong after 200,000 calls, a race that
# behaves only when the contention runs' spread launch shows in `%dynamic_smem_size`). Workspaces are the way to
# keep state within a call. Refused at compile time: a module-scope `.global` variable (a `__device__` or
# `__managed__` one) that the module writes or whose address it takes (read-only tables, and the constants CUB
# and libcu++ declare and never touch, stay allowed), and these special registers.
_MODULE_GLOBAL = re.compile(r"^\s*(?:\.(?:visible|extern|weak|common)\s+)*\.global\s+(?:[^;]*?\s)?(?P<name>[\w$]+)"
                            r"\s*(?:\[[^\]]*\]\s*)*(?:=|;)", re.M)
_PTX_WORD = re.compile(r"[A-Za-z_$][\w$]*")
_PTX_OPCODE = re.compile(r"^\s*(?:@!?%\w+\s+)?(?P<op>[a-z][\w.]*)")
_SPECIAL_REGS = re.compile(r"%(?P<reg>globaltimer(?:_lo|_hi)?|clock(?:64|_hi)?|dynamic_smem_size|total_smem_size|"
                           r"nsmid|gridid)\b")


_PTX_REG = re.compile(r"%[\w$]+")
_PTX_FUNCTION = re.compile(r"^\s*(?:\.(?:visible|extern|weak)\s+)*\.(?:entry|func)\b")


def _written_globals(ptx: str) -> list[str]:
    """Module-scope `.global` variables the PTX may write, in declaration order: named or reached (through the
    registers that hold their address, followed within each function) by a store, an atomic or a reduction, or
    whose address goes where it cannot be followed (a call, a store of the pointer itself). Loads from them, a
    table's reads, are not writes."""
    declared = {m.group("name"): m.start() for m in _MODULE_GLOBAL.finditer(ptx)}
    if not declared:
        return []
    decl_lines = {ptx.count("\n", 0, at) for at in declared.values()}
    bad: dict[str, None] = {}
    held: dict[str, set[str]] = {}   # register -> the variables whose address it may hold (this function)
    for n, line in enumerate(ptx.splitlines()):
        if _PTX_FUNCTION.match(line):
            held = {}
        if n in decl_lines:
            continue
        code = line.split("//", 1)[0]
        named = {w for w in _PTX_WORD.findall(code) if w in declared}
        regs = _PTX_REG.findall(code)
        reached = set(named).union(*(held.get(r, set()) for r in regs))
        if not reached:
            continue
        m = _PTX_OPCODE.match(code)
        op = m.group("op") if m else ""
        operands = code[m.end():] if m else code
        if op.startswith(("ld.", "prefetch", "ldu.")):
            continue   # read where it stands (the loaded value is data)
        if op.startswith(("st.", "atom.", "red.", "call", "cp.", "mbarrier", "cvta.to.shared")) or not regs:
            bad.update(dict.fromkeys(sorted(reached, key=declared.get)))
            continue
        dest = _PTX_REG.match(operands.strip())   # arithmetic, mov, cvta: the first operand now holds it too
        if dest is not None:
            held[dest.group(0)] = held.get(dest.group(0), set()) | reached
        else:
            bad.update(dict.fromkeys(sorted(reached, key=declared.get)))
    return sorted(bad, key=declared.get)


def forbidden_state(ptx: str | None, compiler: str) -> list[Diagnostic]:
    """Errors for what the candidate contract forbids in a compiled module (see above), from its PTX."""
    if not ptx:
        return []
    out = [failure(compiler, f"module-scope variable '{name}' (a __device__ or __managed__ global) is written: it "
                   "keeps state from call to call; use a [[workspace]] (zeroed if it must start at 0) for state "
                   "within a call", "forbidden") for name in _written_globals(ptx)]
    regs = sorted({m.group("reg") for m in _SPECIAL_REGS.finditer(ptx)})
    if regs:
        out.append(failure(compiler, "reads " + ", ".join(f"%{r}" for r in regs) + " (clock64(), "
                           "%globaltimer, shared memory sizes, grid ids): a kernel's result must not depend on when "
                           "or how it was launched", "forbidden"))
    return out
