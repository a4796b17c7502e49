"""Launch specs: the expression evaluator (normal and hostile input), spec structure, resolution, TOML."""

import json
import sys

import pytest

from engine.capture.signature import contiguous_strides
from engine.launch import (
    ArgSpec,
    Env,
    Expr,
    LaunchSpec,
    ResolvedArg,
    SpecError,
    parse_spec,
    resolve,
    spec_to_toml,
)


def tensor(dtype, shape, align=16):
    return {"kind": "tensor", "dtype": dtype, "shape": list(shape), "stride": contiguous_strides(list(shape)),
            "align": align, "device": "cuda", "neg": False, "conj": False}


def value(name, v):
    return {"name": name, "kind": "value", "value": v}


def group_norm_card():
    """aten::native_group_norm as the capture records it for an SD-style 512-channel 128×128 block."""
    signature = {
        "op": "aten::native_group_norm",
        "args": [
            {"name": "input", **tensor("bfloat16", [1, 512, 128, 128])},
            {"name": "weight", **tensor("bfloat16", [512])},
            {"name": "bias", **tensor("bfloat16", [512])},
            value("N", 1), value("C", 512), value("HxW", 16384), value("group", 32), value("eps", 1e-6),
        ],
        "aliases": [],
    }
    outputs = [tensor("bfloat16", [1, 512, 128, 128]), tensor("bfloat16", [1, 32]), tensor("bfloat16", [1, 32])]
    return signature, outputs


@pytest.fixture
def gn_env():
    return Env.from_card(*group_norm_card())


@pytest.fixture
def misc_env():
    """A card with a tensor list (one item None), an absent optional tensor, lists, bools and inf."""
    signature = {
        "op": "aten::test",
        "args": [
            {"name": "self", **tensor("float32", [8, 3, 5], align=4)},
            {"name": "tensors", "kind": "tensor_list",
             "items": [tensor("float16", [4, 6]), None, tensor("float16", [2, 6])]},
            {"name": "bias", "kind": "tensor", "absent": True},
            value("kernel_size", [3, 7]), value("flag", True), value("alpha", 0.5),
            value("hi", {"float": "inf"}), value("mode", "tanh"), value("dim", None),
            value("min", 2),  # like aten::clamp's `min`: a name, distinct from the min() function
        ],
        "aliases": [],
    }
    return Env.from_card(signature, [tensor("float32", [8, 3, 5])])


def ev(text, env):
    return Expr.parse(text).evaluate(env)


# --------------------------------------------------------------------------------------- evaluator


@pytest.mark.parametrize("text, expected", [
    ("ceil_div(input.numel, 256)", 32768),
    ("ceil_div(input.numel + 1, 256)", 32769),
    ("ceil_div(-7, 2)", -3),
    ("align_up(100, 64)", 128),
    ("align_up(128, 64)", 128),
    ("min(input.shape[1], 256, group * 4)", 128),
    ("max(N, 2)", 2),
    ("input.shape[-1] * input.shape[-2]", 16384),
    ("input.shape[input.ndim - 3]", 512),
    ("input.stride[0]", 512 * 16384),
    ("input.stride[-1]", 1),
    ("input.itemsize", 2),
    ("input.align", 16),
    ("out1.numel + out2.shape[1]", 64),
    ("out.shape[1]", 512),
    ("-7 // 2", -4),
    ("-7 % 2", 1),
    ("+(3 - 10) * -2", 14),
    ("C // group * HxW", 262144),
    ("1_000 + 0x10", 1016),
])
def test_int_expressions(gn_env, text, expected):
    v = ev(text, gn_env)
    assert v == expected and type(v) is int


@pytest.mark.parametrize("text, expected", [
    ("1.0 / (input.shape[1] // group * input.shape[2] * input.shape[3])", 1 / 262144),
    ("C / group", 16.0),
    ("eps", 1e-6),
    ("eps * 2 + 1", 1.000002),
    ("min(group, 1.5)", 1.5),
    ("max(group, 1.5)", 32.0),  # any float argument makes min/max a float, whatever wins
])
def test_float_expressions(gn_env, text, expected):
    v = ev(text, gn_env)
    assert type(v) is float and v == pytest.approx(expected, rel=1e-15)


def test_names_from_a_card(misc_env):
    assert ev("self.shape[2] * self.align", misc_env) == 20
    assert ev("tensors_0.numel + tensors_2.shape[0]", misc_env) == 26
    assert ev("kernel_size[-1] * kernel_size[0]", misc_env) == 21
    assert ev("flag + 1", misc_env) == 2
    assert ev("alpha * 4", misc_env) == 2.0
    assert ev("min(min, 5)", misc_env) == 2  # the argument `min` and the function min()
    assert ev("out.numel", misc_env) == 120
    assert misc_env.pointer("bias") == ("null",)
    assert misc_env.pointer("tensors_1") == ("null",)
    assert misc_env.pointer("tensors_2") == ("list", "tensors", 2)
    assert misc_env.pointer("out") == ("output", 0)
    assert misc_env.pointer("self") == ("input", "self")


@pytest.mark.parametrize("text, message", [
    ("bias.numel", "absent"),
    ("tensors_1.numel", "absent"),
    ("self", "is a tensor"),
    ("kernel_size", "is a list"),
    ("tensors", "tensor list"),
    ("kernel_size[2]", "out of range"),
    ("self.shape[-4]", "out of range"),
    ("self.shape[alpha]", "an index needs integers"),
    ("hi", "not a number"),
    ("mode + 1", "not a number"),
    ("dim", "None"),
    ("slef.numel", "unknown name 'slef' (known: self, tensors, bias,"),
    ("alpha // 2", "'//' needs integers"),
    ("ceil_div(self.numel, 0)", "needs b > 0"),
    ("self.numel // (flag - 1)", "division by zero"),
    ("self.numel % (flag - 1)", "division by zero"),
    ("alpha / (flag - 1)", "division by zero"),
    ("9223372036854775807 + flag", "overflow"),
    ("-9223372036854775807 - 2", "overflow"),
    ("self.numel * self.numel * self.numel * self.numel * self.numel * self.numel * self.numel "
     "* self.numel * self.numel * self.numel", "overflow"),
    ("1e308 * 10", "not finite"),
])
def test_evaluation_errors(misc_env, text, message):
    with pytest.raises(SpecError) as info:
        ev(text, misc_env)
    assert message in str(info.value)


# ---------------------------------------------------------------------------------- hostile input

HOSTILE = [
    "__import__('os').system('x')",
    "__import__",
    "().__class__.__bases__[0].__subclasses__()",
    "input.__class__",
    "input.shape.__len__()",
    "open('/etc/passwd')",
    "open",
    "getattr(input, 'shape')",
    "getattr(input, shape)",
    "globals()",
    "vars(input)",
    "eval('1')",
    "exec('1')",
    "compile('1', 'x', 'eval')",
    "lambda: 1",
    "(lambda: 1)()",
    "[x for x in (1, 2)]",
    "{x for x in (1,)}",
    "{x: 1 for x in (1,)}",
    "sum(x for x in (1, 2))",
    "10**10**10",
    "2 ** 3",
    "9999999999999999999 * 9999999999999999999",
    "9223372036854775808",
    "1 // 0",
    "1 % 0",
    "1 / 0",
    "input.numel // (N - 1)",
    "(" * 200 + "1" + ")" * 200,
    "-" * 300 + "1",
    "1+" * 200 + "1",
    "max(" + ",".join(["1"] * 150) + ")",
    "1+" * 5000 + "1",  # 10 kB
    "'abc'",
    "b'abc'",
    "f'{input}'",
    "(x := 1)",
    "input.shape[0:2]",
    "input.shape",
    "input.numel[0]",
    "input.data_ptr",
    "input.shape.index(1)",
    "max(*input.shape)",
    "max(1, key=2)",
    "min(1)",
    "ceil_div(1, 2, 3)",
    "1 if 1 else 2",
    "1 < 2",
    "1 and 2",
    "not 1",
    "~1",
    "1 << 62",
    "1 & 1",
    "1 | 1",
    "1 ^ 1",
    "input @ input",
    "(1, 2)",
    "[1]",
    "{}",
    "...",
    "None",
    "True",
    "1j",
    "1e999",
    "input.shape[0]; 1",
    "import os",
    "await x",
    "yield 1",
    "",
    "   ",
    "1\n+1",
    "1\x00",
    "ｉｎｐｕｔ.numel",
    "eps // 1",
    "input",
    "inpt.numel",
]


@pytest.fixture
def tripwire():
    """Fails the test if anything runs code, opens files or starts processes while armed."""
    seen = []
    armed = [False]
    watched = ("exec", "open", "os.system", "subprocess.Popen", "os.exec", "os.posix_spawn", "builtins.input")

    def hook(event, args):
        if armed[0] and event.startswith(watched):
            seen.append(event)

    # Audit hooks cannot be removed; this one is inert whenever it is not armed.
    sys.addaudithook(hook)
    yield armed, seen


@pytest.mark.parametrize("text", HOSTILE, ids=[repr(t[:40]) for t in HOSTILE])
def test_hostile_expressions_are_rejected(gn_env, tripwire, text):
    """Rejected with a SpecError, executing nothing (how fast is scripts' business, not a unit test's)."""
    armed, seen = tripwire
    armed[0] = True
    try:
        with pytest.raises(SpecError):
            Expr.parse(text).evaluate(gn_env)
    finally:
        armed[0] = False
    assert seen == []


def test_tripwire_sees_execution(tripwire):
    armed, seen = tripwire
    armed[0] = True
    try:
        exec("1")  # the tripwire must notice this, or the hostile test above proves nothing
    finally:
        armed[0] = False
    assert seen == ["exec"]


def test_hostile_expression_inside_a_spec_names_its_place():
    spec = {"launch": [{"kernel": "k", "grid": [1, "__import__('os').system('x')"], "block": [32]}]}
    with pytest.raises(SpecError, match=r"^launch\[0\]\.grid\[1\]: names containing '__'"):
        parse_spec(spec)


# --------------------------------------------------------------------------------- group_norm spec

GN_TOML = '''
[[workspace]]
name = "stats"                      # (mean, rstd) per (n, group) as float32
bytes = "N * group * 2 * 4"
zero = true

[[launch]]
kernel = "gn_stats"
grid = ["N * group"]
block = [512]
args = [
  { ptr = "input" },
  { ptr = "ws.stats" },
  { i64 = "C // group * HxW" },
  { f32 = "eps" },
]

[[launch]]
kernel = "gn_apply"
grid = ["ceil_div(input.numel, 256 * 8)", 1, 1]
block = [256, 1, 1]
shared = "group * 2 * 4"
args = [
  { ptr = "input" }, { ptr = "weight" }, { ptr = "bias" }, { ptr = "ws.stats" },
  { ptr = "out0" }, { ptr = "out1" }, { ptr = "out2" },
  { i64 = "input.numel" },
  { i32 = "HxW" },
  { u32 = "C // group" },
  { i32 = 32 },
  { f32 = "1.0 / (input.shape[1] // group * input.shape[2] * input.shape[3])" },
  { f64 = 0.5 },
]
'''

GN_JSON = {
    "workspace": [{"name": "stats", "bytes": "N * group * 2 * 4", "zero": True}],
    "launch": [
        {"kernel": "gn_stats", "grid": ["N * group"], "block": [512],
         "args": [{"ptr": "input"}, {"ptr": "ws.stats"}, {"i64": "C // group * HxW"}, {"f32": "eps"}]},
        {"kernel": "gn_apply", "grid": ["ceil_div(input.numel, 256 * 8)", 1, 1], "block": [256, 1, 1],
         "shared": "group * 2 * 4",
         "args": [{"ptr": "input"}, {"ptr": "weight"}, {"ptr": "bias"}, {"ptr": "ws.stats"},
                  {"ptr": "out0"}, {"ptr": "out1"}, {"ptr": "out2"}, {"i64": "input.numel"},
                  {"i32": "HxW"}, {"u32": "C // group"}, {"i32": 32},
                  {"f32": "1.0 / (input.shape[1] // group * input.shape[2] * input.shape[3])"},
                  {"f64": 0.5}]},
    ],
}


def test_group_norm_spec_resolves(gn_env):
    r = resolve(parse_spec(GN_TOML), gn_env)
    assert r.workspaces == (("stats", 256, True),)
    stats, apply = r.launches
    assert (stats.kernel, stats.grid, stats.block, stats.shared) == ("gn_stats", (32, 1, 1), (512, 1, 1), 0)
    assert stats.args == (ResolvedArg("ptr", ("input", "input")), ResolvedArg("ptr", ("workspace", "stats")),
                          ResolvedArg("i64", 262144), ResolvedArg("f32", 1e-6))
    assert (apply.kernel, apply.grid, apply.block, apply.shared) == ("gn_apply", (4096, 1, 1), (256, 1, 1), 256)
    assert [a.value for a in apply.args] == [
        ("input", "input"), ("input", "weight"), ("input", "bias"), ("workspace", "stats"),
        ("output", 0), ("output", 1), ("output", 2), 1 * 512 * 128 * 128, 16384, 16, 32, 1 / 262144, 0.5]
    assert [a.ctype for a in apply.args][7:] == ["i64", "i32", "u32", "i32", "f32", "f64"]
    assert type(apply.args[11].value) is float and type(apply.args[8].value) is int


def test_toml_and_json_forms_are_equal():
    from_toml = parse_spec(GN_TOML)
    assert parse_spec(GN_JSON) == from_toml
    assert parse_spec(json.dumps(GN_JSON)) == from_toml
    assert parse_spec(json.dumps(GN_JSON), fmt="json") == from_toml
    assert parse_spec(GN_TOML, fmt="toml") == from_toml
    assert len(from_toml.launches) == 2 and from_toml.workspaces[0].zero


def test_spec_to_toml_round_trips(gn_env):
    spec = parse_spec(GN_TOML)
    text = spec_to_toml(spec)
    again = parse_spec(text)
    assert again == spec
    assert spec_to_toml(again) == text
    assert resolve(again, gn_env) == resolve(spec, gn_env)
    odd = parse_spec({"launch": [{"kernel": "k", "grid": -1, "block": ["1_0", "+2"], "shared": "0",
                                  "args": [{"f32": 1e-06}, {"i32": "-3"}, {"f64": "eps"}, {"ptr": "tensors_0"}]},
                                 {"kernel": "k2", "grid": [1], "block": [1]}]})
    assert parse_spec(spec_to_toml(odd)) == odd
    # a cooperative launch (every block resident at once) says so in TOML and keeps it when resolved
    coop = parse_spec({"launch": [{"kernel": "k", "grid": [132], "block": [1024], "cooperative": True}]})
    assert "cooperative = true" in spec_to_toml(coop) and parse_spec(spec_to_toml(coop)) == coop
    assert resolve(coop, gn_env).launches[0].cooperative and not resolve(spec, gn_env).launches[0].cooperative
    assert "cooperative" not in text


def test_arg_and_expr_equality_is_by_text():
    assert ArgSpec("i32", " group ") == ArgSpec("i32", "group")
    assert Expr.parse(256) == Expr.parse("256")
    assert hash(Expr.parse("N * 2")) == hash(Expr.parse("N * 2"))


# ------------------------------------------------------------------------------- structure errors

def _gn(**launch0):
    spec = json.loads(json.dumps(GN_JSON))
    spec["launch"][0].update(launch0)
    return spec


@pytest.mark.parametrize("spec, message", [
    ({"launches": []}, "launches: unknown key (allowed: launch, workspace)"),
    ({}, "launch: missing"),
    ({"launch": []}, "launch: must have at least one entry"),
    ({"launch": {"kernel": "k"}}, "launch: must be a list"),
    ({"launch": ["k"]}, "launch[0]: must be a table"),
    ({"launch": [{"grid": [1], "block": [1]}]}, "launch[0]: missing 'kernel'"),
    ({"launch": [{"kernel": "k", "block": [1]}]}, "launch[0]: missing 'grid'"),
    (_gn(gird=[1]), "launch[0].gird: unknown key"),
    (_gn(kernel="gn stats"), "launch[0].kernel: must be the extern \"C\" name"),
    (_gn(kernel=7), "launch[0].kernel"),
    (_gn(grid=[]), "launch[0].grid: needs 1 to 3 dims, got 0"),
    (_gn(grid=[1, 1, 1, 1]), "launch[0].grid: needs 1 to 3 dims, got 4"),
    (_gn(block=[True]), "launch[0].block[0]: booleans are not expressions"),
    (_gn(block=[32.0]), "launch[0].block[0]: must be an int"),
    (_gn(grid=["N *"]), "launch[0].grid[0]: syntax error"),
    (_gn(grid=["N / 2"]), "launch[0].grid[0]: '/' gives a float; integer types need '//'"),
    (_gn(shared="1.5 * N"), "launch[0].shared: a float literal"),
    (_gn(args={"ptr": "input"}), "launch[0].args: must be a list"),
    (_gn(cooperative="yes"), "launch[0].cooperative: must be true or false"),
    (_gn(args=[{"ptr": "input"}, {"int": "N"}]), "launch[0].args[1]: unknown arg type 'int'"),
    (_gn(args=[{"ptr": "input", "i32": "N"}]), "launch[0].args[0]: must be a table with exactly one"),
    (_gn(args=[{}]), "launch[0].args[0]: must be a table with exactly one"),
    (_gn(args=["input"]), "launch[0].args[0]: must be a table with exactly one"),
    (_gn(args=[{"ptr": "input"}, {"ptr": "ws.nope"}]),
     "launch[0].args[1] (ptr): workspace 'nope' is not declared (declared: stats)"),
    (_gn(args=[{"ptr": "input[0]"}]), "launch[0].args[0] (ptr): ptr must name"),
    (_gn(args=[{"ptr": 3}]), "launch[0].args[0] (ptr): must be a tensor name"),
    (_gn(args=[{"i32": 1.5}]), "launch[0].args[0] (i32): integer types need an int"),
    (_gn(args=[{"u32": "C / group"}]), "launch[0].args[0] (u32): '/' gives a float; integer types need '//'"),
    (_gn(args=[{"f32": "eps ** 2"}]), "launch[0].args[0] (f32): operator '**' is not allowed"),
    (_gn(args=[{"f32": float("inf")}]), "launch[0].args[0] (f32): float inf is not finite"),
    ({"workspace": {"name": "a"}, "launch": GN_JSON["launch"]}, "workspace: must be a list"),
    ({"workspace": [{"name": "stats", "bytes": 8}, {"name": "stats", "bytes": 8}], "launch": GN_JSON["launch"]},
     "workspace[1].name: duplicate workspace 'stats'"),
    ({"workspace": [{"name": "stats", "size": 8}], "launch": GN_JSON["launch"]},
     "workspace[0].size: unknown key (allowed: name, bytes, zero)"),
    ({"workspace": [{"name": "stats"}], "launch": GN_JSON["launch"]}, "workspace[0]: missing 'bytes'"),
    ({"workspace": [{"name": "ws.x", "bytes": 1}], "launch": GN_JSON["launch"]}, "workspace[0].name"),
    ({"workspace": [{"name": "stats", "bytes": 8, "zero": 1}], "launch": GN_JSON["launch"]},
     "workspace[0].zero: must be true or false"),
    ({"workspace": [{"name": "stats", "bytes": "N / 2"}], "launch": GN_JSON["launch"]}, "workspace[0].bytes: '/'"),
    ("[[launch]]\nkernel = ", "spec: invalid TOML"),
    ("{\"launch\": [", "spec: invalid JSON"),
    ("[1, 2]", "spec: invalid TOML"),
    ("x" * 70000, "spec: longer than"),
])
def test_structure_errors_name_their_path(spec, message):
    with pytest.raises(SpecError) as info:
        parse_spec(spec)
    assert message in str(info.value), str(info.value)


def test_spec_error_is_a_value_error_with_a_path():
    with pytest.raises(ValueError) as info:
        parse_spec(_gn(grid=["N *"]))
    assert isinstance(info.value, SpecError)
    assert info.value.path == "launch[0].grid[0]" and info.value.reason.startswith("syntax error")


def test_bad_fmt_is_a_programming_error():
    with pytest.raises(ValueError, match="fmt"):
        parse_spec(GN_TOML, fmt="yaml")


# -------------------------------------------------------------------------------- resolve errors

@pytest.mark.parametrize("launch0, message", [
    ({"grid": ["ceil_div(inpt.numel, 256)"]},
     "launch[0].grid[0]: unknown name 'inpt' (known: input, weight, bias, N, C, HxW, group, eps, out0, out1, "
     "out2, out)"),
    ({"args": [{"ptr": "input"}, {"ptr": "ws.stats"}, {"i64": "N"}, {"i32": "4294967296"}]},
     "launch[0].args[3] (i32): value 4294967296 does not fit in i32"),
    ({"args": [{"i32": "-2147483649"}]}, "launch[0].args[0] (i32): value -2147483649 does not fit in i32"),
    ({"args": [{"u32": "-1"}]}, "launch[0].args[0] (u32): value -1 does not fit in u32"),
    ({"args": [{"u64": "N - 2"}]}, "launch[0].args[0] (u64): value -1 does not fit in u64"),
    ({"args": [{"i32": "eps"}]}, "launch[0].args[0] (i32): gives a float"),
    ({"args": [{"f32": "1e39"}]}, "launch[0].args[0] (f32): value 1e+39 is not representable in f32"),
    ({"args": [{"ptr": "eps"}]}, "launch[0].args[0] (ptr): 'eps' is not a tensor"),
    ({"args": [{"ptr": "outt"}]}, "launch[0].args[0] (ptr): unknown tensor 'outt' (tensors: input, weight, bias, "
                                  "out0, out1, out2, out)"),
    ({"block": [2048]}, "launch[0].block: 2048 threads per block exceed 1024"),
    ({"block": [32, 32, 2]}, "launch[0].block: 2048 threads per block exceed 1024"),
    ({"block": [1, 1, 128]}, "launch[0].block[2]: z = 128 exceeds 64"),
    ({"block": [0]}, "launch[0].block[0]: x = 0; must be ≥ 1"),
    ({"grid": ["N - 1"]}, "launch[0].grid[0]: x = 0; must be ≥ 1"),
    ({"grid": [1, 65536]}, "launch[0].grid[1]: y = 65536 exceeds 65535"),
    ({"grid": [2**31]}, "launch[0].grid[0]: x = 2147483648 exceeds 2147483647"),
    ({"grid": ["eps"]}, "launch[0].grid[0]: gives a float"),
    ({"shared": 227 * 1024 + 1}, "launch[0].shared: 232449 bytes of dynamic shared memory; must be 0 … 232448"),
    ({"shared": "-N"}, "launch[0].shared: -1 bytes"),
    ({"shared": "input.numel // (N - 1)"}, "launch[0].shared: division by zero"),
])
def test_resolve_errors_name_their_path(gn_env, launch0, message):
    spec = parse_spec(_gn(**launch0))
    with pytest.raises(SpecError) as info:
        resolve(spec, gn_env)
    assert message in str(info.value), str(info.value)


def test_negative_workspace_is_rejected(gn_env):
    spec = parse_spec({"workspace": [{"name": "w", "bytes": "N - 2"}],
                       "launch": [{"kernel": "k", "grid": [1], "block": [1]}]})
    with pytest.raises(SpecError, match=r"^workspace\[0\]\.bytes: must be ≥ 0, got -1$"):
        resolve(spec, gn_env)


def test_max_shared_overrides_the_limit(gn_env):
    spec = parse_spec(_gn(shared=100 * 1024))
    assert resolve(spec, gn_env).launches[0].shared == 100 * 1024
    with pytest.raises(SpecError, match="must be 0 … 49152"):
        resolve(spec, gn_env, max_shared=48 * 1024)


def test_absent_optional_tensor_passes_null(misc_env):
    spec = parse_spec({"launch": [{"kernel": "k", "grid": ["ceil_div(self.numel, 128)"], "block": [128],
                                   "args": [{"ptr": "self"}, {"ptr": "bias"}, {"ptr": "tensors_1"},
                                            {"ptr": "tensors_2"}, {"ptr": "out"}]}]})
    (launch,) = resolve(spec, misc_env).launches
    assert [a.value for a in launch.args] == [("input", "self"), ("null",), ("null",), ("list", "tensors", 2),
                                              ("output", 0)]
    with pytest.raises(SpecError, match="tensor list; point at its items tensors_0 … tensors_2"):
        resolve(parse_spec({"launch": [{"kernel": "k", "grid": 1, "block": 1, "args": [{"ptr": "tensors"}]}]}),
                misc_env)


def test_hand_built_spec_is_checked_too(gn_env):
    with pytest.raises(SpecError, match="integer types need '//'"):
        ArgSpec("i32", "C / 2")
    with pytest.raises(SpecError, match="unknown arg type"):
        ArgSpec("int", "C")
    with pytest.raises(SpecError, match="strings are not allowed"):
        ArgSpec("f32", "'x'")
    spec = parse_spec(_gn(args=[{"ptr": "ws.stats"}]))
    hand = LaunchSpec(spec.launches, ())  # drop the workspace the ptr needs
    with pytest.raises(SpecError, match=r"launch\[0\]\.args\[0\] \(ptr\): workspace 'stats' is not declared"):
        resolve(hand, gn_env)


# ------------------------------------------------------------------------- resource bounds by the card


def small_card_env():
    """aten::relu on a 1024-element fp32 tensor: 8 KiB of tensors, 2048 elements."""
    signature = {"op": "aten::relu", "args": [{"name": "self", **tensor("float32", [1024])}], "aliases": []}
    return Env.from_card(signature, [tensor("float32", [1024])])


def _ws(nbytes, *more):
    return {"workspace": [{"name": "scratch", "bytes": nbytes}, *more],
            "launch": [{"kernel": "k", "grid": [4], "block": [256], "args": [{"ptr": "ws.scratch"}]}]}


def test_a_huge_workspace_is_a_spec_error_naming_it():
    with pytest.raises(SpecError) as info:
        resolve(parse_spec(_ws(2**62)), small_card_env())
    assert str(info.value) == (
        f"workspace[0].bytes: workspace 'scratch' asks for {2**62} bytes; at most {256 << 20} are allowed "
        "(max(256 MiB, 16 × the card's 8192 tensor bytes))")


def test_workspace_limit_scales_with_the_card_and_free_memory(gn_env):
    # bf16: input and out0 [1,512,128,128], weight and bias [512], out1 and out2 [1,32]
    gn_bytes = 2 * (2 * 512 * 128 * 128 + 2 * 512 + 2 * 32)
    assert resolve(parse_spec(_ws(256 << 20)), small_card_env()).workspaces == (("scratch", 256 << 20, False),)
    assert resolve(parse_spec(_ws(16 * gn_bytes)), gn_env).workspaces[0][1] == 16 * gn_bytes
    with pytest.raises(SpecError, match=f"at most {16 * gn_bytes} are allowed"):
        resolve(parse_spec(_ws(16 * gn_bytes + 1)), gn_env)
    with pytest.raises(SpecError, match=r"workspace 'scratch' asks for 1048576 bytes; at most 1000 are allowed "
                                        r"\(the GPU memory free for it\)"):
        resolve(parse_spec(_ws(1 << 20)), small_card_env(), max_workspace_bytes=1000)
    spec = parse_spec(_ws(200 << 20, {"name": "more", "bytes": 200 << 20}))
    with pytest.raises(SpecError, match=r"^workspace: the workspaces ask for 419430400 bytes together"):
        resolve(spec, small_card_env())


def test_an_astronomical_grid_is_a_spec_error():
    spec = parse_spec({"launch": [{"kernel": "k", "grid": ["2147483647", 65535], "block": [1024]}]})
    with pytest.raises(SpecError) as info:
        resolve(spec, small_card_env())
    assert str(info.value) == (
        "launch[0].grid: 140735340806145 blocks × 1024 threads = 144112988985492480 threads exceed the "
        "16777216 this card allows (max(2**24, 64 × its 2048 tensor elements))")


def test_thread_limit_allows_a_thread_per_element_with_splits(gn_env):
    numel = 512 * 128 * 128
    ok = parse_spec(_gn(grid=["ceil_div(input.numel, 256) * 64"], block=[256]))
    assert resolve(ok, gn_env).launches[0].grid[0] == numel // 256 * 64
    # the same launch on the small card: 64 × 2048 elements is below 2**24, which still applies
    small = parse_spec({"launch": [{"kernel": "k", "grid": [65536], "block": [256]}]})
    assert resolve(small, small_card_env()).launches[0].grid == (65536, 1, 1)
    with pytest.raises(SpecError, match=r"^launch\[0\]\.grid: 65537 blocks × 256 threads"):
        resolve(parse_spec({"launch": [{"kernel": "k", "grid": [65537], "block": [256]}]}), small_card_env())


# ------------------------------------------------------------------- the launcher: out of memory is a launch error


def _hungry_launcher(device, nbytes):
    """A launcher with no kernels and one workspace of `nbytes`: allocation is all its run() does before
    launching, so it needs no compiled module."""
    from engine.launch import ResolvedSpec
    from engine.launch.launcher import CandidateLauncher

    out = tensor("float32", [1024])
    return CandidateLauncher(None, ResolvedSpec((), (("scratch", nbytes, False),)), "aten::relu", [out], device)


def test_out_of_memory_while_allocating_is_launch_rejected():
    import torch

    from engine.launch.launcher import LaunchRejected

    launcher = _hungry_launcher(torch.device("cpu"), 2**62)
    with pytest.raises(LaunchRejected, match=r"^out of memory allocating the outputs and workspaces "
                                             rf"\(workspaces: scratch = {2**62} B\): "):
        launcher.run([("self", torch.zeros(1024))])


@pytest.mark.gpu
def test_cuda_out_of_memory_is_launch_rejected_and_the_device_stays_usable():
    import torch

    from engine.launch.launcher import LaunchRejected

    device = torch.device("cuda", 0)
    with pytest.raises(LaunchRejected, match="out of memory allocating"):
        _hungry_launcher(device, 2**52).run([("self", torch.zeros(1024, device=device))])
    (out,) = _hungry_launcher(device, 1 << 20).run([("self", torch.zeros(1024, device=device))])
    torch.cuda.synchronize()
    assert out.shape == (1024,) and out.device == device
