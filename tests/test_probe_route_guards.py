"""scripts/probe_route_guards.py: each way of hooking a module in is compiled and timed, and the table names
them all; bad counts are refused in one line. (What it times is the CPU's guard work; nothing is asserted of
the numbers.)"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import probe_route_guards as probe  # noqa: E402


def test_every_way_is_compiled_timed_and_reported(tmp_path, capsys):
    assert probe.main(["--blocks", "1", "--rounds", "2", "--calls", "3", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "probe_route_guards.json").read_text())
    assert set(doc["median_us"]) == set(probe.WAYS) and doc["hooked"] == 2
    assert all(len(v) == 2 for v in doc["rounds_us"].values())
    table = (tmp_path / "probe_route_guards.md").read_text()
    assert all(f"| {how} |" in table for how in probe.WAYS)


def test_a_route_hooked_by_the_class_dispatcher_still_serves_eager_calls():
    import torch

    cls = probe.norm_class("NormProbe")
    model = probe.build(1, cls)
    owner = probe._Owner()
    probe.hook(model, "class dispatcher", cls, owner)
    from engine.cast.modules import ROUTE_ATTR

    served = []
    route = model[0].n1.__dict__[ROUTE_ATTR]

    class Counted:
        cls, module = route.cls, route.module

        def __call__(self, *a):
            served.append(1)
            return route(*a)

    model[0].n1.__dict__[ROUTE_ATTR] = Counted()
    with torch.no_grad():
        model(torch.randn(2, 16))
    assert served == [1]


def test_a_count_below_one_exits_2_naming_it(capsys):
    assert probe.main(["--rounds", "0"]) == 2
    assert capsys.readouterr().err.strip() == "error: --rounds must be at least 1"
