"""A tiny, safe arithmetic language for launch specs: parsed once by a whitelist walk, never compiled.

User text goes through `ast.parse(mode="eval")` only to get a tree; every node is checked against a
whitelist and evaluated by our own interpreter, so nothing the text says is ever executed.
"""

from __future__ import annotations

import ast
import math
import warnings
from dataclasses import dataclass, field
from typing import Any

MAX_TEXT = 512
MAX_NODES = 128
MAX_DEPTH = 32
INT_MAX = 2**63 - 1  # every intermediate int stays within ±INT_MAX (int64 without its extra negative)

SCALAR_ATTRS = ("numel", "ndim", "itemsize", "align")
INDEXED_ATTRS = ("shape", "stride")
FUNCTIONS = ("min", "max", "ceil_div", "align_up")

_BINOPS: dict[type, str] = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//", ast.Mod: "%",
                            ast.Div: "/"}
_UNARY: dict[type, str] = {ast.USub: "-", ast.UAdd: "+"}
# Friendlier names for constructs people (or agents) try, so the rejection says what was wrong.
_REFUSED: dict[type, str] = {
    ast.Lambda: "lambda", ast.ListComp: "comprehensions", ast.SetComp: "comprehensions",
    ast.DictComp: "comprehensions", ast.GeneratorExp: "comprehensions", ast.JoinedStr: "f-strings",
    ast.FormattedValue: "f-strings", ast.NamedExpr: "':=' (walrus)", ast.Compare: "comparisons",
    ast.BoolOp: "'and'/'or'", ast.IfExp: "conditional expressions", ast.Tuple: "tuples",
    ast.List: "lists", ast.Dict: "dicts", ast.Set: "sets", ast.Starred: "starred arguments",
    ast.Await: "await", ast.Yield: "yield", ast.YieldFrom: "yield", ast.Slice: "slices",
}
_ITEMSIZE = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2, "int8": 1,
    "uint64": 8, "uint32": 4, "uint16": 2, "uint8": 1, "bool": 1, "complex128": 16, "complex64": 8,
    "complex32": 4, "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1,
}


class SpecError(ValueError):
    """A launch spec or expression is invalid; `path` says where (e.g. 'launch[0].grid[1]')."""

    def __init__(self, reason: str, path: str = "") -> None:
        self.reason = reason
        self.path = path
        super().__init__(f"{path}: {reason}" if path else reason)

    def at(self, path: str) -> SpecError:
        """This error located at `path` (an error that already has a path keeps it)."""
        return self if self.path else SpecError(self.reason, path)


# ---------------------------------------------------------------------------------------------- env


@dataclass(frozen=True)
class TensorInfo:
    """What expressions may read of a tensor."""

    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    align: int
    itemsize: int

    @property
    def numel(self) -> int:
        """Number of elements (product of the shape)."""
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes the tensor stands for: its elements, or the storage span they touch if that is wider."""
        if self.numel == 0:
            return 0
        span = 1 + sum((n - 1) * abs(st) for n, st in zip(self.shape, self.stride))
        return max(self.numel, span) * self.itemsize

    @classmethod
    def from_descriptor(cls, d: dict[str, Any]) -> TensorInfo:
        """Build from a signature tensor descriptor (`describe_tensor` output)."""
        return cls(dtype=d["dtype"], shape=tuple(int(s) for s in d["shape"]),
                   stride=tuple(int(s) for s in d["stride"]), align=int(d.get("align", 16)),
                   itemsize=itemsize_of(d["dtype"]))


def itemsize_of(dtype: str) -> int:
    """Bytes per element of a dtype named as in signatures ('bfloat16')."""
    if dtype in _ITEMSIZE:
        return _ITEMSIZE[dtype]
    import torch  # only for dtypes the table lacks; keeps spec parsing torch-free otherwise

    dt = getattr(torch, dtype, None)
    if not isinstance(dt, torch.dtype):
        raise SpecError(f"unknown dtype {dtype!r}")
    return dt.itemsize


@dataclass(frozen=True)
class _Binding:
    kind: str  # "tensor" | "absent" | "number" | "numbers" | "tensor_list" | "other"
    value: Any  # TensorInfo | int | float | tuple of numbers | list length | description
    ref: tuple | None = None  # for tensors: the pointer reference the launcher resolves


class Env:
    """The names a launch spec may use: tensor arguments, outputs, list items and plain values."""

    def __init__(self) -> None:
        self._names: dict[str, _Binding] = {}

    @property
    def names(self) -> tuple[str, ...]:
        """Every bound name, in binding order."""
        return tuple(self._names)

    @property
    def tensor_names(self) -> tuple[str, ...]:
        """Names a `ptr` may refer to (present or absent tensors)."""
        return tuple(n for n, b in self._names.items() if b.kind in ("tensor", "absent"))

    def tensors(self) -> list[TensorInfo]:
        """Every distinct tensor of the card (inputs, list items, outputs), each once (`out` is `out0`)."""
        seen: dict[tuple, TensorInfo] = {}
        for b in self._names.values():
            if b.kind == "tensor" and b.ref is not None:
                seen.setdefault(b.ref, b.value)
        return list(seen.values())

    def _bind(self, name: str, binding: _Binding, *, replace: bool = True) -> None:
        if replace or name not in self._names:
            self._names[name] = binding

    def add_tensor(self, name: str, info: TensorInfo | None, ref: tuple) -> None:
        """Bind a tensor (None: an absent optional tensor, whose pointer is NULL) with its pointer ref."""
        if info is None:
            self._bind(name, _Binding("absent", None, ("null",)))
        else:
            self._bind(name, _Binding("tensor", info, ref))

    def add_value(self, name: str, value: Any) -> None:
        """Bind a plain (decoded) value; numbers and number lists become usable, anything else is named."""
        self._bind(name, _value_binding(value))

    @classmethod
    def from_card(cls, signature: dict[str, Any], outputs: list[dict[str, Any]]) -> Env:
        """Names from a card: schema arguments, list items `NAME_j`, outputs `out0…` and `out` (= out0)."""
        # Imported here so that parsing and checking specs does not pull in torch.
        from engine.capture.signature import decode_value

        env = cls()
        lists: list[tuple[str, list]] = []
        for a in signature["args"]:
            name, kind = a["name"], a["kind"]
            if kind == "tensor":
                info = None if a.get("absent") else TensorInfo.from_descriptor(a)
                env.add_tensor(name, info, ("input", name))
            elif kind == "tensor_list":
                env._bind(name, _Binding("tensor_list", len(a["items"])))
                lists.append((name, a["items"]))
            else:
                try:
                    env.add_value(name, decode_value(a.get("value")))
                except ValueError:
                    env._bind(name, _Binding("other", "a value expressions cannot use"))
        # Schema names win over derived ones: a derived name never hides a real argument.
        for k, d in enumerate(outputs):
            env._bind(f"out{k}", _Binding("tensor", TensorInfo.from_descriptor(d), ("output", k)),
                      replace=False)
        for name, items in lists:
            for j, d in enumerate(items):
                binding = (_Binding("absent", None, ("null",)) if d is None else
                           _Binding("tensor", TensorInfo.from_descriptor(d), ("list", name, j)))
                env._bind(f"{name}_{j}", binding, replace=False)
        if outputs:
            env._bind("out", _Binding("tensor", TensorInfo.from_descriptor(outputs[0]), ("output", 0)),
                      replace=False)
        return env

    def _get(self, name: str) -> _Binding:
        b = self._names.get(name)
        if b is None:
            raise SpecError(f"unknown name {name!r} (known: {_listing(self.names)})")
        return b

    def pointer(self, name: str) -> tuple:
        """The pointer reference of tensor `name`: ('input', n), ('output', k), ('list', n, j), ('null',)."""
        b = self._names.get(name)
        if b is None:
            raise SpecError(f"unknown tensor {name!r} (tensors: {_listing(self.tensor_names)})")
        if b.kind == "tensor_list":
            raise SpecError(f"{name!r} is a tensor list; point at its items {name}_0 … {name}_{b.value - 1}")
        if b.ref is None:
            raise SpecError(f"{name!r} is not a tensor (tensors: {_listing(self.tensor_names)})")
        return b.ref

    def tensor(self, name: str) -> TensorInfo:
        """Tensor `name`, or SpecError if it is absent or not a tensor."""
        b = self._get(name)
        if b.kind == "tensor":
            return b.value
        if b.kind == "absent":
            raise SpecError(f"tensor {name!r} is absent (None); only its ptr (NULL) may be used")
        raise SpecError(f"{name!r} is not a tensor")

    def number(self, name: str) -> int | float:
        """Scalar value `name` (bools as ints)."""
        b = self._get(name)
        if b.kind == "number":
            return b.value
        if b.kind in ("tensor", "absent"):
            raise SpecError(f"{name!r} is a tensor; use {name}.numel, {name}.shape[i], {name}.stride[i], …")
        if b.kind == "numbers":
            raise SpecError(f"{name!r} is a list; index it: {name}[i]")
        if b.kind == "tensor_list":
            raise SpecError(f"{name!r} is a tensor list; use its items {name}_0 … {name}_{b.value - 1}")
        raise SpecError(f"{name!r} is {b.value}, not a number")

    def numbers(self, name: str) -> tuple[int | float, ...]:
        """List value `name`, for subscripting."""
        b = self._get(name)
        if b.kind == "numbers":
            return b.value
        if b.kind in ("tensor", "absent"):
            raise SpecError(f"{name!r} is a tensor; index {name}.shape[i] or {name}.stride[i]")
        raise SpecError(f"{name!r} is not a list of numbers")


def _listing(names: tuple[str, ...], limit: int = 32) -> str:
    if not names:
        return "none"
    shown = ", ".join(names[:limit])
    return shown + (f", … ({len(names) - limit} more)" if len(names) > limit else "")


def _value_binding(v: Any) -> _Binding:
    if _is_number(v):
        return _number_binding(v)
    if isinstance(v, (list, tuple)) and v and all(_is_number(x) for x in v):
        bound = [_number_binding(x) for x in v]
        bad = next((b for b in bound if b.kind != "number"), None)
        return bad if bad else _Binding("numbers", tuple(b.value for b in bound))
    if v is None:
        return _Binding("other", "None")
    return _Binding("other", f"a {type(v).__name__}")


def _is_number(v: Any) -> bool:
    return isinstance(v, (bool, int, float))


def _number_binding(v: bool | int | float) -> _Binding:
    if isinstance(v, bool):
        return _Binding("number", int(v))
    if isinstance(v, int):
        return _Binding("number", v) if abs(v) <= INT_MAX else _Binding("other", f"{v} (beyond int64)")
    if math.isfinite(v):
        return _Binding("number", float(v))
    return _Binding("other", f"{v!r} (expressions need finite numbers)")


# ------------------------------------------------------------------------------------------- parsing


@dataclass(frozen=True)
class Expr:
    """An expression's source text and its validated tree; equal when the texts are equal."""

    text: str
    node: ast.expr = field(compare=False, repr=False)
    has_float: bool = field(default=False, compare=False, repr=False)  # uses '/' or a float literal

    @classmethod
    def parse(cls, source: str | int | float) -> Expr:
        """Validate `source` (expression text, or an int/float literal) against the whitelist."""
        text = _source_text(source)
        node = _parse_text(text)
        state = _CheckState()
        _check(node, 1, state)
        return cls(text, node, state.has_float)

    @property
    def is_literal_int(self) -> bool:
        """True when the text is exactly a canonical int literal, e.g. '256' or '-1'."""
        try:
            return str(int(self.text)) == self.text
        except ValueError:
            return False

    def check_int(self) -> None:
        """Raise SpecError when the expression's value is a float whatever the names hold."""
        if self.has_float:
            raise SpecError(_float_reason(self.node))

    def evaluate(self, env: Env) -> int | float:
        """The value of the expression in `env`; SpecError on any problem."""
        return _eval(self.node, env)

    def evaluate_int(self, env: Env) -> int:
        """The value, which must be an int (for sizes, grid/block dims and integer arguments)."""
        self.check_int()
        v = _eval(self.node, env)
        if not isinstance(v, int):
            raise SpecError(f"gives a float ({v!r}); integer types need an int")
        return v


def _float_reason(node: ast.expr) -> str:
    for n in ast.walk(node):
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div):
            return "'/' gives a float; integer types need '//'"
    return "a float literal makes the value a float; integer types need an int"


def _source_text(source: Any) -> str:
    if isinstance(source, bool):
        raise SpecError("booleans are not expressions; use 1 or 0")
    if isinstance(source, int):
        if abs(source) > INT_MAX:
            raise SpecError(f"integer literal {source} exceeds 64 bits")
        return str(source)
    if isinstance(source, float):
        if not math.isfinite(source):
            raise SpecError(f"float {source!r} is not finite")
        return repr(source)
    if not isinstance(source, str):
        raise SpecError(f"expected an int or an expression string, got {type(source).__name__}")
    return source.strip()


def _parse_text(text: str) -> ast.expr:
    # Cheap textual limits first, so hostile input never reaches the parser in a costly form.
    if not text:
        raise SpecError("empty expression")
    if len(text) > MAX_TEXT:
        raise SpecError(f"expression longer than {MAX_TEXT} characters ({len(text)})")
    bad = next((c for c in text if not (" " <= c <= "~")), None)
    if bad is not None:
        raise SpecError(f"character {bad!r} not allowed (printable ASCII on one line only)")
    if "__" in text:
        raise SpecError("names containing '__' are not allowed")
    if any(q in text for q in "'\"`"):
        raise SpecError("strings are not allowed")
    depth = deepest = 0
    for c in text:
        depth += c in "([{"
        depth -= c in ")]}"
        deepest = max(deepest, depth)
    if deepest > MAX_DEPTH:
        raise SpecError(f"brackets nested deeper than {MAX_DEPTH}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SyntaxWarnings on odd literals are noise, not errors
            tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise SpecError(f"syntax error: {e.msg} in {text!r}") from None
    except (ValueError, MemoryError, RecursionError):
        raise SpecError("expression too complex") from None
    return tree.body


class _CheckState:
    __slots__ = ("nodes", "has_float")

    def __init__(self) -> None:
        self.nodes = 0
        self.has_float = False


def _check(node: ast.AST, depth: int, st: _CheckState) -> None:
    """Whitelist walk: raise SpecError on the first node outside the language."""
    if depth > MAX_DEPTH:
        raise SpecError(f"expression nested deeper than {MAX_DEPTH}")
    st.nodes += 1
    if st.nodes > MAX_NODES:
        raise SpecError(f"expression has more than {MAX_NODES} nodes")
    if isinstance(node, ast.Constant):
        v = node.value
        if type(v) is int:
            if v > INT_MAX:
                raise SpecError(f"integer literal {v} exceeds 64 bits")
        elif type(v) is float:
            if not math.isfinite(v):
                raise SpecError("float literal is not finite")
            st.has_float = True
        elif isinstance(v, bool):
            raise SpecError("True/False are not allowed; use 1 or 0")
        elif isinstance(v, (str, bytes)):
            raise SpecError("strings are not allowed")
        else:
            raise SpecError(f"literal {v!r} is not allowed (ints and floats only)")
    elif isinstance(node, ast.Name):
        pass  # resolved against the Env at evaluation time
    elif isinstance(node, ast.Attribute):
        _check_attribute(node, indexed=False)
        st.nodes += 1
    elif isinstance(node, ast.Subscript):
        base = node.value
        if isinstance(base, ast.Attribute):
            _check_attribute(base, indexed=True)
            st.nodes += 2
        elif not isinstance(base, ast.Name):
            raise SpecError("only NAME[i], NAME.shape[i] and NAME.stride[i] may be indexed")
        _check(node.slice, depth + 1, st)
    elif isinstance(node, ast.BinOp):
        op = _BINOPS.get(type(node.op))
        if op is None:
            raise SpecError(f"operator {_op_text(node.op)} is not allowed (allowed: + - * // % /)")
        if op == "/":
            st.has_float = True
        if op in ("//", "%", "/") and isinstance(node.right, ast.Constant) and node.right.value == 0:
            raise SpecError(f"division by zero ('{op} 0')")
        _check(node.left, depth + 1, st)
        _check(node.right, depth + 1, st)
    elif isinstance(node, ast.UnaryOp):
        if type(node.op) not in _UNARY:
            raise SpecError(f"operator {_op_text(node.op)} is not allowed (unary - and + only)")
        _check(node.operand, depth + 1, st)
    elif isinstance(node, ast.Call):
        _check_call(node, depth, st)
    else:
        what = _REFUSED.get(type(node), f"'{type(node).__name__}'")
        raise SpecError(f"{what} not allowed in expressions")


def _check_attribute(node: ast.Attribute, *, indexed: bool) -> None:
    if not isinstance(node.value, ast.Name):
        raise SpecError("attributes are allowed only on a name: NAME.numel, NAME.shape[i], …")
    name, attr = node.value.id, node.attr
    if attr in INDEXED_ATTRS:
        if not indexed:
            raise SpecError(f"{name}.{attr} needs an index: {name}.{attr}[i]")
    elif attr in SCALAR_ATTRS:
        if indexed:
            raise SpecError(f"{name}.{attr} is a number and cannot be indexed")
    else:
        raise SpecError(f"attribute {attr!r} not allowed (allowed: {', '.join(SCALAR_ATTRS + INDEXED_ATTRS)})")


def _check_call(node: ast.Call, depth: int, st: _CheckState) -> None:
    if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
        raise SpecError(f"only {', '.join(FUNCTIONS)} may be called")
    fn = node.func.id
    if node.keywords:
        raise SpecError(f"{fn}() takes no keyword arguments")
    for a in node.args:
        if isinstance(a, ast.Starred):
            raise SpecError("starred arguments not allowed in expressions")
    n = len(node.args)
    if fn in ("min", "max") and n < 2:
        raise SpecError(f"{fn}() needs at least 2 arguments")
    if fn in ("ceil_div", "align_up") and n != 2:
        raise SpecError(f"{fn}() takes exactly 2 arguments ({n} given)")
    for a in node.args:
        _check(a, depth + 1, st)


def _op_text(op: ast.AST) -> str:
    return {ast.Pow: "'**'", ast.MatMult: "'@'", ast.BitAnd: "'&'", ast.BitOr: "'|'", ast.BitXor: "'^'",
            ast.LShift: "'<<'", ast.RShift: "'>>'", ast.Invert: "'~'", ast.Not: "'not'"}.get(
                type(op), f"'{type(op).__name__}'")


# ---------------------------------------------------------------------------------------- evaluation


def _int(v: int) -> int:
    if abs(v) > INT_MAX:
        raise SpecError(f"integer overflow (|{v}| > 2**63-1)")
    return v


def _flt(v: float) -> float:
    if not math.isfinite(v):
        raise SpecError("float result is not finite")
    return v


def _num(v: int | float) -> int | float:
    return _int(v) if isinstance(v, int) else _flt(v)


def _need_int(v: int | float, what: str) -> int:
    if not isinstance(v, int):
        raise SpecError(f"{what} needs integers, got {v!r}")
    return v


def _eval(node: ast.expr, env: Env) -> int | float:
    # Depth is bounded by _check (≤ MAX_DEPTH), so this recursion is shallow.
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return _num(env.number(node.id))
    if isinstance(node, ast.Attribute):
        info = env.tensor(node.value.id)  # type: ignore[attr-defined]
        return _int(getattr(info, node.attr))
    if isinstance(node, ast.Subscript):
        return _eval_subscript(node, env)
    if isinstance(node, ast.UnaryOp):
        v = _eval(node.operand, env)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp):
        return _eval_binop(_BINOPS[type(node.op)], _eval(node.left, env), _eval(node.right, env))
    if isinstance(node, ast.Call):
        args = [_eval(a, env) for a in node.args]
        return _eval_call(node.func.id, args)  # type: ignore[attr-defined]
    raise SpecError(f"'{type(node).__name__}' not allowed in expressions")  # unreachable after _check


def _eval_subscript(node: ast.Subscript, env: Env) -> int | float:
    base = node.value
    if isinstance(base, ast.Attribute):
        name = f"{base.value.id}.{base.attr}"  # type: ignore[attr-defined]
        seq: tuple = getattr(env.tensor(base.value.id), base.attr)  # type: ignore[attr-defined]
    else:
        name = base.id  # type: ignore[attr-defined]
        seq = env.numbers(name)
    i = _need_int(_eval(node.slice, env), "an index")
    if not -len(seq) <= i < len(seq):
        raise SpecError(f"index {i} out of range for {name} (length {len(seq)})")
    return _num(seq[i])


def _eval_binop(op: str, a: int | float, b: int | float) -> int | float:
    if op in ("//", "%"):
        a, b = _need_int(a, f"'{op}'"), _need_int(b, f"'{op}'")
        if b == 0:
            raise SpecError(f"division by zero in '{op}'")
        return a // b if op == "//" else a % b
    if op == "/":
        if b == 0:
            raise SpecError("division by zero in '/'")
        return _flt(a / b)
    r = a + b if op == "+" else a - b if op == "-" else a * b
    return _num(r)


def _eval_call(fn: str, args: list[int | float]) -> int | float:
    if fn in ("min", "max"):
        r = min(args) if fn == "min" else max(args)
        # Any float argument makes the result a float, so an expression's type never depends on values.
        return float(r) if any(isinstance(x, float) for x in args) else r
    a, b = (_need_int(x, f"{fn}()") for x in args)
    if b <= 0:
        raise SpecError(f"{fn}(a, b) needs b > 0, got {b}")
    q = -(-a // b)
    return q if fn == "ceil_div" else _int(q * b)
