"""Why ViT-B/16's eager forward read 5.43 ms in bench_e2e and 3.54 ms in bench_compose (H100, 2026-12-07).
Eager's host issue time and device time per forward, in one process, after each thing a bench does before
timing: fresh; the cast loaded; one forward with the cast enabled (graph-route capture); install/remove
cycles; Varied.record; a gc.collect. python docs/results/report-2026-12-07/vit_probe.py docs/results/report-2026-12-07/h100-2026-12-07/vit_b16/vit_b16.cast $OUT/vit_probe.json"""
import gc
import json
import sys
import time

import torch

from engine.bench.forward import time_steady
from engine.bench.host import issue_us
from engine.config import config_model


def measure(tag, forward, out, n=15):
    with torch.no_grad():
        for _ in range(3):
            forward()
        torch.cuda.synchronize()
        iss, wall = issue_us(forward, n)
        dev = sorted(time_steady(forward) for _ in range(n))[n // 2]
    out[tag] = {"issue_us": iss, "wall_us": wall, "device_us": dev}
    print(f"{tag:45s} issue {iss:8.0f} us  wall {wall:8.0f} us  events {dev:8.0f} us", flush=True)


def main():
    import engine.cast
    from engine.bench.varied import Varied

    cast_path, dest = sys.argv[1], sys.argv[2]
    out = {"gpu": torch.cuda.get_device_name()}
    module, forward = config_model("configs/examples/vit_b16.toml")
    measure("fresh", forward, out)
    cast = engine.cast.load(cast_path)
    measure("cast loaded", forward, out)
    with torch.no_grad(), cast.enabled(module):
        forward()
    measure("after one forward with the cast enabled", forward, out)
    with torch.no_grad(), cast.enabled(module):
        measure("inside cast.enabled(module)", forward, out)
    for _ in range(20):
        with torch.no_grad():
            cast.install(module)
            forward()
            cast.remove()
    measure("after 20 install/forward/remove", forward, out)
    varied = Varied.record(module, forward)
    measure("after Varied.record", forward, out)
    varied.restore()
    gc.collect()
    measure("after gc.collect", forward, out)
    with torch.no_grad():
        from engine.bench.host import python_profile
        out["profile_eager"] = python_profile(forward, calls=5, top=12)
    print(out["profile_eager"])
    t0 = time.perf_counter()
    with open(dest, "w") as f:
        json.dump(out, f, indent=1)
    print("wrote", dest, time.perf_counter() - t0)


if __name__ == "__main__":
    main()
