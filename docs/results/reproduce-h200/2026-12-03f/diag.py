import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from engine.capture.fake_outputs import fake_outputs
from engine.cast import compose
print("torch", torch.__version__)
op = torch.ops.aten.native_group_norm.default
def t(shape, stride, dt="bfloat16"): return {"kind":"tensor","dtype":dt,"shape":shape,"stride":stride,"device":"cuda"}
CL = [8388608,1,32768,128]
sig={"args":[dict(t([1,128,256,256],CL),name="input"),dict(t([128],[1]),name="weight"),dict(t([128],[1]),name="bias"),
 {"kind":"int","name":"N","value":1},{"kind":"int","name":"C","value":128},{"kind":"int","name":"HxW","value":65536},{"kind":"int","name":"group","value":32},{"kind":"float","name":"eps","value":1e-6}]}
print("fake_outputs", [o["stride"] for o in fake_outputs("aten::native_group_norm", sig)])
with FakeTensorMode() as m:
    x = torch.empty_strided([1,128,256,256], CL, dtype=torch.bfloat16, device="cuda")
    w = torch.empty(128, dtype=torch.bfloat16, device="cuda")
    print("fake factory", [o.stride() for o in op(x, w, w, 1, 128, 65536, 32, 1e-6)])
x = torch.randn(1,128,256,256, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
w = torch.randn(128, device="cuda", dtype=torch.bfloat16)
print("real cuda", [o.stride() for o in op(x, w, w, 1, 128, 65536, 32, 1e-6)])
xm = x.to("meta"); wm = w.to("meta")
print("meta device", [o.stride() for o in op(xm, wm, wm, 1, 128, 65536, 32, 1e-6)])
orig = compose._held_output_strides
def spy(fx_node, held):
    r = orig(fx_node, held); print("held_output_strides", held, "->", r); return r
compose._held_output_strides = spy
orig_cov = compose.covered_layouts
def spy_cov(*a, **k):
    r = orig_cov(*a, **k); print("covered_layouts", r); return r
compose.covered_layouts = spy_cov
