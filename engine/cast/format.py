"""The .cast file: a zip of `manifest.json`, `report.md` and `kernels/` (cubin, PTX, CUDA source).

Nothing in it is executable Python and nothing is pickled: the manifest is JSON, kernels are the
compiler's own images, and the reader refuses any member it does not expect. `write_cast` is a pure
function of the manifest and the files; `read_cast` checks structure, format version and digests and
names what is wrong, so the loader can fall back to PyTorch for exactly the affected variants.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FORMAT = "kforge-cast"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
REPORT = "report.md"
CATEGORIES = ("custom CUDA", "backend-wrapping", "fallback")
# Members a cast may hold; anything else (a .pkl, a .py, a nested path) makes the file damaged.
_MEMBER = re.compile(r"(manifest\.json|report\.md|kernels/[A-Za-z0-9_.-]{1,128}\.(cubin|ptx|cu))")
MAX_MEMBER_BYTES = 256 << 20
_VARIANT_KEYS = ("id", "op", "signature", "outputs", "launch_spec", "kernels", "files", "category",
                 "evidence", "provenance")
# A module card: a variant whose op is the chain op and whose signature is a chain card's
# (engine.capture.chains.chain_signature) carries `module`: the class name and the module paths it was
# proven for, how the forward's arguments and the module's tensors feed the chain's inputs, and the
# autocast state at proof (engine.cast.modules says how each is used).
CHAIN_OP = "kforge::chain"  # engine.capture.chains.CHAIN_OP (kept equal by tests/test_cast_modules.py)


class CastWarning(UserWarning):
    """A cast (or some of its variants) stays on PyTorch; the message says why."""


class CastError(Exception):
    """The file cannot be used at all (not a zip, damaged, unknown format version, bad manifest)."""


@dataclass
class CastFile:
    """A read cast: its manifest, the bytes of its kernel files, and per-variant problems found."""

    path: str
    manifest: dict[str, Any]
    files: dict[str, bytes]
    problems: dict[str, str] = field(default_factory=dict)  # variant id -> why it cannot be used

    @property
    def variants(self) -> list[dict[str, Any]]:
        return self.manifest["variants"]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_entry(name: str, data: bytes, **extra: Any) -> dict[str, Any]:
    """A manifest file record: member path, size and sha256 (plus e.g. the arch of a cubin)."""
    return {"path": name, "bytes": len(data), "sha256": sha256(data), **extra}


def write_cast(path: str | Path | None, manifest: dict[str, Any], files: dict[str, bytes],
               report: str) -> bytes:
    """Write the zip (to `path` when given, atomically) and return its bytes. Pure apart from the write."""
    check_manifest(manifest)
    for name in files:
        if not _MEMBER.fullmatch(name) or name in (MANIFEST, REPORT):
            raise ValueError(f"not a kernel file name a cast may hold: {name!r}")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as z:
        # Fixed timestamps: the same winners give the same bytes.
        def put(name: str, data: bytes) -> None:
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
        put(MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())
        put(REPORT, report.encode())
        for name in sorted(files):
            put(name, files[name])
    data = buf.getvalue()
    if path is not None:
        target = Path(path)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_bytes(data)
        tmp.replace(target)
    return data


def check_manifest(m: Any) -> None:
    """Raise CastError if the manifest lacks what a loader relies on, or holds it in another shape
    (`MANIFEST_SHAPE`): a wrong type is named by its place (`variants[3].files must be a table of files,
    not a string`), never met later as an exception in the loader or in `audit`."""
    if not isinstance(m, dict):
        raise CastError("manifest.json is not a JSON object")
    if m.get("format") != FORMAT:
        raise CastError(f"manifest.json does not describe a Kernel Forge cast (format {m.get('format')!r})")
    version = m.get("format_version")
    # `true` and `1.0` equal 1 in Python: they were read as version 1
    if (why := shape_problem(version, int, "format_version")) is not None:
        raise CastError(f"manifest.json: {why}")
    if version != FORMAT_VERSION:
        raise CastError(f"format version {version!r} is not supported (this Kernel Forge reads version "
                        f"{FORMAT_VERSION}); export the cast again with this version")
    for key in ("env", "variants"):
        if key not in m:
            raise CastError(f"manifest.json lacks {key!r}")
    if not isinstance(m["variants"], list):
        raise CastError("manifest.json: 'variants' is not a list")
    for i, v in enumerate(m["variants"]):
        missing = [k for k in _VARIANT_KEYS if not isinstance(v, dict) or k not in v]
        if missing:
            raise CastError(f"manifest.json: variant {i} lacks {', '.join(missing)}")
    if (why := shape_problem(m, MANIFEST_SHAPE)) is not None:
        raise CastError(f"manifest.json: {why}")
    seen = set()
    for v in m["variants"]:
        if v["id"] in seen:
            raise CastError(f"manifest.json: variant id {v['id']!r} appears twice")
        seen.add(v["id"])
        if v["category"] not in CATEGORIES:
            raise CastError(f"manifest.json: variant {v['id']}: unknown category {v['category']!r}")
        if v["op"] == CHAIN_OP:
            why = _pattern_problem(v) if "pattern" in v and "module" not in v else _module_problem(v)
            if why:
                raise CastError(f"manifest.json: variant {v['id']}: {why}")


# ---- the manifest's shape -------------------------------------------------------------------------------
# What each field that the loader, `audit` or report.md reads must be. A shape is a type (str; int: a whole
# number; float: any number; bool; dict: any table; list: any list), None (null), a tuple (any one of its
# shapes), a dict {key: shape} (a table whose named keys, where present, have those shapes; other keys are
# free), or one of the classes below. Numbers may be non-finite (a measurement can be); `audit --json`
# writes those as null.

@dataclass(frozen=True)
class ListOf:
    """A list whose every item has the shape `item`."""
    item: Any
    text: str = "a list"


@dataclass(frozen=True)
class TableOf:
    """A table whose every value has the shape `item` (its keys are free)."""
    item: Any
    text: str = "a table"


@dataclass(frozen=True)
class Pair:
    """A list of exactly two items of the shape `item` (a confidence interval: [low, high])."""
    item: Any
    text: str = "a pair of numbers"


@dataclass(frozen=True)
class Matches:
    """A string that matches `pattern` in full."""
    pattern: str
    text: str


NAME = Matches(r"(?s).+", "a non-empty string")
_NUMBER = (float, None)
_CI = (Pair(_NUMBER), None)
_MEASURED = {"speedup": _NUMBER, "speedup_ci": _CI, "eager_us": _NUMBER, "cast_us": _NUMBER,
             "compile_us": _NUMBER, "copy_us": _NUMBER}
_MODEL_CHECK = {"mode": (str, None), "speedup": _NUMBER, "speedup_ci": _CI, "eager_ms": _NUMBER,
                "cast_ms": _NUMBER, "eager_speedup": _NUMBER, "rel_l2_err": _NUMBER}
_ROUTES = {"classes": ListOf(str), "speedup": _NUMBER, "speedup_ci": _CI, "rel_l2_err": _NUMBER,
           "targets": ListOf(str), "tried": ListOf(str)}
MANIFEST_SHAPE = {
    "format_version": int,
    # compat.incompatibility compares arch and torch_minor as strings ("sm_90", "2.11")
    "env": {"arch": (str, None), "torch": (str, None),
            "torch_minor": (Matches(r"\d+\.\d+", 'a torch minor version such as "2.11"'), None)},
    "source": {"model_check": (_MODEL_CHECK, None), "model_checks": TableOf((_MODEL_CHECK, None)),
               "graph_routes": (_ROUTES, None),
               "layout_routes": ({**_ROUTES, "signatures": TableOf((list, dict)), "graphs": (_MEASURED, None)}, None)},
    "variants": ListOf({
        "id": NAME, "op": str, "signature": dict, "signature_text": str, "outputs": (list, None),
        "kernels": ListOf(str), "category": str, "targets": ListOf(str), "tolerance": ListOf(str),
        # a file record that is no table keeps only its variant off (read_cast names it)
        "files": TableOf(object, "a table of files"),
        "evidence": {"confirmed": (_MEASURED, None), "lane": (_MEASURED, None),
                     "sanitizer": ({"tools": ListOf(str)}, None)},
        "provenance": dict, "chain": ({"ops": (ListOf(str), None)}, None),
    }),
}


def shape_problem(value: Any, shape: Any, where: str = "") -> str | None:
    """Why `value` does not have `shape` (`MANIFEST_SHAPE` says how shapes are written), naming the place
    (`variants[3].files`), or None where it does."""
    if isinstance(shape, tuple):
        fitting = [s for s in shape if _outer_fits(value, s)]
        if not fitting:
            return f"{where} must be {_shape_text(shape)}, not {_kind(value)}"
        problems = [shape_problem(value, s, where) for s in fitting]
        return None if None in problems else problems[0]
    if not _outer_fits(value, shape):
        return f"{where} must be {_shape_text(shape)}, not {_kind(value)}"
    if isinstance(shape, dict):
        parts: Any = ((k, value[k], s) for k, s in shape.items() if k in value)
    elif isinstance(shape, (ListOf, Pair)):
        parts = ((f"[{i}]", item, shape.item) for i, item in enumerate(value))
    elif isinstance(shape, TableOf):
        parts = ((k, item, shape.item) for k, item in value.items())
    else:
        return None
    for key, item, s in parts:
        at = f"{where}{key}" if key.startswith("[") else f"{where}.{key}" if where else key
        if (why := shape_problem(item, s, at)) is not None:
            return why
    return None


def _outer_fits(value: Any, shape: Any) -> bool:
    if shape is None:
        return value is None
    if shape is object:
        return True
    if isinstance(shape, tuple):
        return any(_outer_fits(value, s) for s in shape)
    if isinstance(shape, (dict, TableOf)):
        return isinstance(value, dict)
    if isinstance(shape, ListOf):
        return isinstance(value, list)
    if isinstance(shape, Pair):
        return isinstance(value, list) and len(value) == 2
    if isinstance(shape, Matches):
        return isinstance(value, str) and re.fullmatch(shape.pattern, value) is not None
    if shape is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if shape is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, shape)


def _shape_text(shape: Any) -> str:
    if isinstance(shape, tuple):
        return " or ".join(_shape_text(s) for s in shape)
    if isinstance(shape, (ListOf, TableOf, Pair, Matches)):
        return shape.text
    if isinstance(shape, dict):
        return "a table"
    return {None: "null", str: "a string", int: "a whole number", float: "a number", bool: "true or false",
            dict: "a table", list: "a list"}.get(shape, str(shape))


def _kind(value: Any) -> str:
    """A value as the message names it: a scalar as JSON writes it (`true`, `1.0`, `null`), else its kind."""
    if isinstance(value, str):
        return f"the string {value!r}" if len(value) <= 40 else "a long string"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list"
    return json.dumps(value)


def module_card(v: dict[str, Any]) -> dict[str, Any] | None:
    """The module entry of a module-card variant, None for an op variant."""
    return v.get("module") if v.get("op") == CHAIN_OP else None


def pattern_card(v: dict[str, Any]) -> dict[str, Any] | None:
    """The pattern entry of a pattern-card variant (a chain replaced inside compiled graphs), else None."""
    return v.get("pattern") if v.get("op") == CHAIN_OP and "module" not in v else None


def _pattern_problem(v: dict[str, Any]) -> str | None:
    if not isinstance(v.get("pattern"), dict):
        return "a pattern card's 'pattern' entry is not a table"
    sig = v.get("signature")
    if not isinstance(sig, dict) or not isinstance(sig.get("chain"), dict) or sig.get("op") != CHAIN_OP:
        return "a chain variant's signature is not a chain card's"
    return None


def _module_problem(v: dict[str, Any]) -> str | None:
    m = v.get("module")
    if not isinstance(m, dict):
        return "a chain variant lacks its 'module' entry (class and paths) or its 'pattern' entry"
    if not isinstance(m.get("class"), str) or not m["class"]:
        return "module entry: 'class' is not a class name"
    paths = m.get("paths")
    if not isinstance(paths, list) or not paths or not all(isinstance(p, str) for p in paths):
        return "module entry: 'paths' is not a non-empty list of module paths"
    for key, item in (("args", ("input", "value")), ("params", ("name",))):
        seq = m.get(key, [])
        if not isinstance(seq, list) or not all(isinstance(a, dict) and any(k in a for k in item) for a in seq):
            return f"module entry: {key!r} is malformed"
    if not isinstance(m.get("autocast", []), list):
        return "module entry: 'autocast' is not a list"
    states = m.get("states", [])
    if not isinstance(states, list) or not all(isinstance(x, dict) for x in states):
        return "module entry: 'states' is not a list of attribute tables"
    held = m.get("held", [])
    if not isinstance(held, list) or not all(isinstance(x, dict) for x in held):
        return "module entry: 'held' is not a list of attribute tables"
    if m.get("training") is not None and not isinstance(m["training"], bool):
        return "module entry: 'training' is not true or false"
    if "class_path" in m and not isinstance(m["class_path"], str):
        return "module entry: 'class_path' is not a dotted class name"
    if "returns" in m and m["returns"] != "output":
        return "module entry: 'returns' is not 'output'"
    sig = v.get("signature")
    if not isinstance(sig, dict) or not isinstance(sig.get("chain"), dict) or sig.get("op") != CHAIN_OP:
        return "a chain variant's signature is not a chain card's"
    return None


def read_cast(path: str | Path) -> CastFile:
    """Open and check a cast. Whole-file damage raises CastError; a variant whose files are missing,
    unreadable or fail their sha256 is listed in `problems` (the others stay usable)."""
    p = Path(path)
    try:
        z = zipfile.ZipFile(p)
    except FileNotFoundError:
        raise CastError(f"{p}: no such file") from None
    except Exception as e:  # BadZipFile, OSError, and whatever else a hostile central directory raises
        raise CastError(f"{p}: not a readable zip ({e}); the file is damaged or not a .cast") from None
    with z:
        names = z.namelist()
        bad = [n for n in names if not _MEMBER.fullmatch(n)]
        if bad:
            raise CastError(f"{p}: unexpected member {bad[0]!r} (a cast holds only manifest.json, report.md "
                            "and kernels/*.cubin|ptx|cu)")
        # Two members of one name: zipfile reads the last, `unzip` shows the first, so a reviewer could read
        # another manifest (or kernel) than the one that runs.
        twice = sorted(n for n, k in Counter(names).items() if k > 1)
        if twice:
            raise CastError(f"{p}: member {twice[0]!r} appears twice (zip tools disagree on which one counts); "
                            "the file is damaged or was altered")
        if MANIFEST not in names:
            raise CastError(f"{p}: no manifest.json; the file is damaged or not a .cast")
        try:
            manifest = json.loads(_read(z, MANIFEST))
        except Exception as e:  # a bad CRC or deflate stream, an encrypted member, a method zipfile lacks, deep JSON
            raise CastError(f"{p}: manifest.json is damaged ({e})") from None
        try:
            check_manifest(manifest)
        except CastError as e:
            raise CastError(f"{p}: {e}") from None
        files: dict[str, bytes] = {}
        problems: dict[str, str] = {}
        for i, v in enumerate(manifest["variants"]):
            for role, entry in sorted(v["files"].items()):
                if not isinstance(entry, dict):
                    problems.setdefault(v["id"], f"variants[{i}].files.{role} is not a file record")
                    continue
                name = entry.get("path")
                if not isinstance(name, str) or name not in names:
                    problems.setdefault(v["id"], f"{role} file {name!r} is missing")
                    continue
                try:
                    data = files[name] if name in files else _read(z, name)
                except Exception as e:  # as for the manifest: only this variant stays off
                    problems.setdefault(v["id"], f"{name} is damaged ({e})")
                    continue
                if sha256(data) != entry.get("sha256"):
                    problems.setdefault(v["id"], f"digest mismatch: {name}")
                    continue
                files[name] = data
    return CastFile(str(p), manifest, files, problems)


# What Python's zipfile reads; any other method (Deflate64, which some zip tools write for large files, or
# an unknown number) is named instead of zipfile's NotImplementedError.
_METHODS = {zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA}


def _read(z: zipfile.ZipFile, name: str) -> bytes:
    info = z.getinfo(name)
    if info.file_size > MAX_MEMBER_BYTES:
        raise ValueError(f"{name} is {info.file_size} bytes, more than a cast member may be")
    if info.flag_bits & 0x1:  # `zip -e`: zipfile asks for a password (RuntimeError)
        raise ValueError("encrypted; a cast never is")
    if info.compress_type not in _METHODS:
        raise ValueError(f"zip compression method {info.compress_type}, which Python's zipfile cannot read")
    return z.read(name)  # zipfile checks the CRC-32 on read: a flipped byte raises BadZipFile


# The targets a variant can be proven for (engine.cast.cpp_router.TARGET_BITS holds them in this order).
TARGET_NAMES = ("eager", "cuda-graphs", "compile", "compile:max-autotune-no-cudagraphs", "compile:reduce-overhead")


def legacy_targets(manifest: dict[str, Any]) -> frozenset[str] | None:
    """What a variant without recorded targets runs under: the mode of the cast's one whole-model check,
    where the manifest records one that measured (`source.model_check.mode`: a cast exported before targets
    were recorded has that check as its only whole-model proof), else None: no whole-model check at all
    (a script's cast, `export --no-model-check`), and the variant runs wherever the cast is installed."""
    check = (manifest.get("source") or {}).get("model_check") or {}
    mode = check.get("mode")
    return frozenset({mode}) if mode in TARGET_NAMES and check.get("speedup") is not None else None


def legacy_targets_text(manifest: dict[str, Any]) -> str:
    """One sentence: where the variants of a cast without recorded targets run (audit, report.md)."""
    held = legacy_targets(manifest)
    if held is None:
        return ("no targets recorded and no whole-model check: every variant runs wherever the cast is installed "
                "(eager, CUDA graphs, torch.compile)")
    return (f"no targets recorded: every variant runs only under {', '.join(sorted(held))}, the mode of the "
            "cast's one whole-model check (its only proof for the whole model)")
