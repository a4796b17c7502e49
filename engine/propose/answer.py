"""Pull a candidate (CUDA source + launch spec) out of a model's free-text answer.

Models wrap code in prose, split a file over several fences, mislabel fences, give the spec as JSON,
add host code, or stop mid-answer. `extract` turns all of that into either a usable candidate or one
category that says what was wrong, so the repair loop knows whether to ask again, follow up, or stop:

    empty      blank answer                      no-code    nothing with a __global__ kernel
    not-cuda   Python/Triton instead of CUDA     no-spec    kernel found, launch spec missing
    bad-spec   spec unparsable or names a        host-code  main(), <<<>>>, cudaMalloc, streams,
               kernel the source lacks                      torch headers
    truncated  the answer stopped inside the kernel source
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from engine.launch.expr import SpecError
from engine.launch.spec import parse_spec

UNUSABLE = ("empty", "no-code", "not-cuda", "no-spec", "bad-spec", "host-code", "truncated")

_CUDA_TAGS = frozenset({"cuda", "cu", "cuh", "cpp", "c++", "cxx", "cc", "c", "h", "hpp", "nvrtc"})
_SPEC_TAGS = frozenset({"toml", "json", "jsonc", "json5"})
_PY_TAGS = frozenset({"python", "py", "python3", "triton", "ipython", "pycon"})
_KNOWN_TAGS = _CUDA_TAGS | _SPEC_TAGS | _PY_TAGS
# A fence opens with 3+ backticks or tildes (up to 3 spaces indent) and an optional info string.
_FENCE = re.compile(r"^ {0,3}(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\n]*?)\s*$")
_GLOBAL = re.compile(r"\b__global__\b")
_SPEC_HEADER = re.compile(r"^\s*\[\[\s*(launch|workspace)\s*\]\]", re.M)
_PY_HINTS = (re.compile(r"^\s*import\s+triton\b", re.M), re.compile(r"^\s*@triton\.jit", re.M),
             re.compile(r"^\s*def\s+\w+\s*\(", re.M), re.compile(r"^\s*(from\s+\w[\w.]*\s+)?import\s+\w", re.M),
             re.compile(r"\bload_inline\s*\("))
# Host-side constructs the candidate contract forbids (checked with comments and strings removed).
# Lines no CUDA C++ file has but every Python file does.
_PY_LINE = re.compile(r"^\s*((from\s+[\w.]+\s+)?import\s+\w|def\s+\w+\s*\()", re.M)
_HOST = (
    (re.compile(r"\bint\s+main\s*\("), "int main("),
    (re.compile(r"<<<"), "<<<...>>> kernel launch"),
    (re.compile(r"\bcudaMalloc\w*\s*\("), "cudaMalloc"),
    (re.compile(r"\bcudaMemcpy\w*\s*\("), "cudaMemcpy"),
    (re.compile(r"\bcudaFree\w*\s*\("), "cudaFree"),
    (re.compile(r"\bcudaStream\w*"), "CUDA streams"),
    (re.compile(r"\bcudaDeviceSynchronize\s*\("), "cudaDeviceSynchronize"),
    (re.compile(r"#\s*include\s*[<\"](torch|ATen|c10|pybind11)/"), "#include of torch/ATen/pybind11"),
)
_KERNEL_DECL = re.compile(
    r"\b__global__\s+(?:(?:static|inline|__forceinline__|__noinline__)\s+)*"
    r"(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(?P<name>\w+)\s*\("
)
_EXTERN_C = re.compile(r'\bextern\s+"C"')
_EXTERN_C_BLOCK = re.compile(r'\bextern\s+"C"\s*\{')
_DEVICE_FN = re.compile(r"\b(?:__device__|__global__)[^;{()]*?\b(\w+)\s*\(")


@dataclass(frozen=True)
class Extracted:
    """What an answer holds: source and spec (text as written), or the category of the problem."""

    source: str | None
    spec: str | None
    category: str | None
    reason: str

    @property
    def ok(self) -> bool:
        return self.category is None and bool(self.source) and bool(self.spec)


@dataclass(frozen=True, eq=False)  # identity equality: two identical blocks are still two blocks
class Block:
    """One fenced block: its info-string tag (lower case), body, and whether its fence was closed."""

    tag: str
    body: str
    closed: bool


# ------------------------------------------------------------------------------------------- fences


def fenced_blocks(text: str) -> list[Block]:
    """Every ``` / ~~~ fenced block in order; an unterminated last fence runs to the end of the text."""
    blocks: list[Block] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info = m.group("fence"), m.group("info")
        tag = _tag(info)
        body: list[str] = []
        i += 1
        closed = False
        while i < len(lines):
            stripped = lines[i].strip()
            # A closing fence: the same character, at least as long, nothing after it.
            if stripped and set(stripped) == {fence[0]} and len(stripped) >= len(fence):
                closed = True
                i += 1
                break
            # A new language fence inside a block: the model forgot to close the previous one.
            opener = _FENCE.match(lines[i])
            if opener and opener.group("fence")[0] == fence[0] and _tag(opener.group("info")) in _KNOWN_TAGS:
                closed = True
                break
            body.append(lines[i])
            i += 1
        blocks.append(Block(tag, "\n".join(body).strip("\n"), closed))
    return blocks


def _tag(info: str) -> str:
    """The language of a fence's info string: '```CUDA title=x' -> 'cuda', '```kernel.cu' -> 'cuda'."""
    word = info.split()[0].lower().strip("{}.") if info.strip() else ""
    if word.endswith((".cu", ".cuh", ".cpp", ".h")):
        return "cuda"
    if word.endswith((".toml", ".json")):
        return word.rsplit(".", 1)[1]
    if word.endswith(".py"):
        return "python"
    return word


def _kind(block: Block) -> str:
    """'cuda' | 'spec' | 'python' | 'other': by content where it is unambiguous (models mislabel fences)."""
    body = block.body
    if block.tag in _PY_TAGS:
        return "python"
    if _GLOBAL.search(body):
        # CUDA text inside Python (load_inline, cupy.RawKernel) is not our format.
        if block.tag not in _CUDA_TAGS and _PY_LINE.search(body):
            return "python"
        return "cuda"
    if _SPEC_HEADER.search(body) or (body.lstrip().startswith("{") and '"launch"' in body):
        return "spec"
    if block.tag in _SPEC_TAGS:
        return "spec"
    if block.tag in _CUDA_TAGS:
        return "cuda"
    if any(p.search(body) for p in _PY_HINTS):
        return "python"
    if re.search(r"^\s*#\s*include\b|\b__device__\b", body, re.M):
        return "cuda"
    return "other"


# ------------------------------------------------------------------------------------ C text helpers


def strip_comments(src: str) -> str:
    """The source with comments, string and char literals blanked (line structure kept)."""
    out: list[str] = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        nxt = src[i + 1] if i + 1 < n else ""
        if c == "/" and nxt == "/":
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif c == "/" and nxt == "*":
            j = src.find("*/", i + 2)
            end = n if j < 0 else j + 2
            out.append("\n" * src.count("\n", i, end))
            i = end
        elif c in "\"'":
            j = i + 1
            while j < n and src[j] != c and src[j] != "\n":
                j += 2 if src[j] == "\\" else 1
            # Blank the literal but keep `extern "C"` recognisable.
            out.append('"C"' if c == '"' and src[i + 1:j] == "C" else c + " " + c)
            i = j + 1 if j < n and src[j] == c else j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def braces_balanced(src: str) -> bool:
    """True when every `{` closes (comments and literals ignored) and the text does not end inside one."""
    depth = 0
    for c in strip_comments(src):
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth < 0:
                return False
    return depth == 0


def looks_complete(src: str) -> bool:
    """A source an answer may have stopped after: balanced braces, and it ends with a `}` or `;`."""
    code = strip_comments(src).rstrip()
    return "{" in code and code.endswith(("}", ";")) and braces_balanced(src)


def kernel_names(src: str) -> tuple[list[str], list[str]]:
    """(extern "C" __global__ entry points, other __global__ kernels whose names get mangled)."""
    code = strip_comments(src)
    spans: list[tuple[int, int]] = []
    for m in _EXTERN_C_BLOCK.finditer(code):
        depth, j = 0, m.end() - 1
        while j < len(code):
            depth += {"{": 1, "}": -1}.get(code[j], 0)
            if depth == 0:
                break
            j += 1
        spans.append((m.start(), j))
    extern, mangled = [], []
    for m in _KERNEL_DECL.finditer(code):
        start = m.start()
        # The declaration's own prefix: back to the previous statement or block boundary.
        cut = max(code.rfind(ch, 0, start) for ch in ";}{")
        prefix = code[cut + 1:start]
        inside = any(a <= start <= b for a, b in spans)
        is_c = (inside or bool(_EXTERN_C.search(prefix))) and "template" not in prefix
        (extern if is_c else mangled).append(m.group("name"))
    return list(dict.fromkeys(extern)), list(dict.fromkeys(mangled))


def host_code(src: str) -> str | None:
    """The first forbidden host construct in the source, or None."""
    code = strip_comments(src)
    for pattern, what in _HOST:
        if pattern.search(code):
            return what
    return None


# ------------------------------------------------------------------------------------------ extract


def extract(text: str) -> Extracted:
    """The candidate in `text`, or the category of what is wrong with it (see the module docstring)."""
    text = (text or "").replace("\r\n", "\n").replace("\r", "\n")
    if not text.strip():
        return Extracted(None, None, "empty", "the answer is empty")
    blocks = fenced_blocks(text)
    if not blocks:
        blocks = _unfenced(text)
    cuda = [b for b in blocks if _kind(b) == "cuda"]
    specs = [b for b in blocks if _kind(b) == "spec"]
    python = [b for b in blocks if _kind(b) == "python"]

    kernels = [b for b in cuda if _GLOBAL.search(b.body)]
    if not kernels:
        if python or (not blocks and any(p.search(text) for p in _PY_HINTS[:3])):
            what = "Triton" if any("triton" in b.body for b in python) else "Python"
            return Extracted(None, None, "not-cuda",
                             f"the answer is {what} code, not a CUDA C++ source with extern \"C\" __global__ kernels")
        if cuda:
            return Extracted(None, None, "no-code", "the code block has no __global__ kernel")
        return Extracted(None, None, "no-code", "no fenced CUDA code block with a __global__ kernel found")

    source = _assemble(cuda, kernels)
    if any(not b.closed for b in cuda) and not looks_complete(source):
        return Extracted(None, None, "truncated", "the answer stops inside the CUDA source")
    host = host_code(source)
    if host is not None:
        return Extracted(source, None, "host-code",
                         f"the source contains host code ({host}); write device code only and describe the "
                         "launch in the spec")
    # A kernel without extern "C" is not rejected here: the spec check names it precisely, and that
    # feedback (a repairable 'bad-spec') fixes it in one round.
    names, mangled = kernel_names(source)
    spec_blocks = [b for b in specs if b.closed]  # an unterminated spec may lack its last launches
    if not spec_blocks:
        cut = " (the answer was cut off inside it)" if specs else ""
        return Extracted(source, None, "no-spec", f"the answer has the kernel but no launch spec{cut}")
    return _with_spec(source, spec_blocks, names, mangled)


def _unfenced(text: str) -> list[Block]:
    """An answer without fences: the code from its first C-looking line, the spec from `[[launch]]`."""
    lines = text.split("\n")
    start = next((i for i, ln in enumerate(lines)
                  if re.match(r'\s*(#\s*include|extern\s+"C"|__global__|__device__|template\s*<|#define|'
                              r"struct\s+\w+|namespace\s+\w+)", ln)), None)
    if start is None:
        return []
    spec_at = next((i for i in range(start, len(lines)) if _SPEC_HEADER.match(lines[i])), len(lines))
    out = [Block("cuda", "\n".join(lines[start:spec_at]).strip("\n"), True)]
    if spec_at < len(lines):
        out.append(Block("toml", "\n".join(lines[spec_at:]).strip("\n"), True))
    return out


def _assemble(cuda: list[Block], kernels: list[Block]) -> str:
    """One source from the CUDA blocks: parts of one file are joined, alternative versions are not."""
    seen: set[str] = set()
    alternatives = False
    for b in kernels:
        names = set(_declared_kernels(b.body))
        if names & seen:
            alternatives = True  # the same kernel twice: a revised version follows the first
        seen |= names
    if alternatives:
        return kernels[-1].body
    if len(cuda) == 1:
        return cuda[0].body
    parts: list[str] = []
    full = "\n".join(b.body for b in kernels)
    defined = set(_DEVICE_FN.findall(strip_comments(full)))
    for b in cuda:
        if not any(b is k for k in kernels):
            if host_code(b.body):
                continue  # an illustrative host snippet next to the kernel, not part of the file
            if b.body.strip() in full or set(_DEVICE_FN.findall(strip_comments(b.body))) & defined:
                continue  # a helper repeated inside the full file
        parts.append(b.body)
    return "\n\n".join(parts)


def _declared_kernels(src: str) -> list[str]:
    """Names of every __global__ function, extern "C" or not."""
    return [m.group("name") for m in _KERNEL_DECL.finditer(strip_comments(src))]


def _with_spec(source: str, spec_blocks: list[Block], names: list[str], mangled: list[str]) -> Extracted:
    """Pick the spec (the last one that parses) and check that it launches only kernels the source has."""
    errors: list[str] = []
    for b in reversed(spec_blocks):
        try:
            spec = parse_spec(b.body)
        except SpecError as e:
            errors.append(str(e))
            continue
        problem = missing_kernels(spec.launches, names, mangled)
        if problem:
            return Extracted(source, b.body, "bad-spec", problem)
        return Extracted(source, b.body, None, "ok")
    return Extracted(source, spec_blocks[-1].body, "bad-spec", f"the launch spec does not parse: {errors[0]}")


def missing_kernels(launches: tuple, names: list[str], mangled: list[str]) -> str | None:
    """Why the spec's kernels are not all extern "C" entry points of the source, or None."""
    for i, launch in enumerate(launches):
        if launch.kernel in names:
            continue
        if launch.kernel in mangled:
            return (f"launch[{i}] names kernel '{launch.kernel}', which is __global__ but not extern \"C\" "
                    "(its name gets mangled); declare it extern \"C\" __global__")
        return (f"launch[{i}] names kernel '{launch.kernel}', but the source has no extern \"C\" __global__ "
                f"function of that name (entry points: {', '.join(names)})")
    return None


def complete_spec(first: Extracted, text: str) -> Extracted:
    """Merge a follow-up answer that should hold only the launch spec into `first` (which lacked one).

    A follow-up that resends a whole answer (kernel and spec) is taken as a whole when it is usable.
    """
    text = (text or "").replace("\r\n", "\n").replace("\r", "\n")
    if not text.strip():
        return Extracted(first.source, None, "no-spec", "the follow-up for the launch spec was empty")
    if _GLOBAL.search(text):
        whole = extract(text)
        if whole.ok:
            return whole
    source = first.source or ""
    names, mangled = kernel_names(source)
    blocks = [b for b in fenced_blocks(text) if _kind(b) == "spec" and b.closed]
    if not blocks:
        bare = text.strip()
        blocks = [Block("toml", bare, True)] if _SPEC_HEADER.search(bare) or bare.startswith("{") else []
    if not blocks:
        return Extracted(source, None, "no-spec", "the follow-up had no launch spec either")
    return _with_spec(source, blocks, names, mangled)
