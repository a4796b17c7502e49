"""ViT-B/16 eager timed as bench_e2e times it (alternating with the cast's arm, install/remove around each cast
call), against eager timed alone in the same process (H100, 2026-12-07). python docs/results/report-2026-12-07/vit_probe2.py docs/results/report-2026-12-07/h100-2026-12-07/vit_b16/vit_b16.cast $OUT/vit_probe2.json"""
import json
import statistics
import sys

import torch

from engine.bench.forward import time_steady
from engine.bench.host import host_pair
from engine.config import config_model


def main():
    import engine.cast
    from engine.bench.varied import Varied

    cast_path, dest = sys.argv[1], sys.argv[2]
    out = {"gpu": torch.cuda.get_device_name()}
    module, forward = config_model("configs/examples/vit_b16.toml")
    cast = engine.cast.load(cast_path)
    with torch.no_grad():
        with cast.enabled(module):
            forward()
        for _ in range(3):
            forward()
        out["eager_alone_us"] = statistics.median(time_steady(forward) for _ in range(20))
        for use_varied in (False, True):
            varied = Varied.record(module, forward) if use_varied else None
            e, c = [], []
            for i in range(20):
                first = varied.new_pair() if varied else 0
                for arm in (("eager", "cast") if i % 2 == 0 else ("cast", "eager")):
                    kw = {}
                    if varied:
                        varied.seek(first)
                        kw = {"before": varied.before}
                    if arm == "cast":
                        cast.install(module)
                        c.append(time_steady(forward, **kw))
                        cast.remove()
                    else:
                        e.append(time_steady(forward, **kw))
            if varied:
                varied.restore()
            out[f"e2e_loop_varied={use_varied}"] = {"eager_us": statistics.median(e), "cast_us": statistics.median(c),
                                                    "eager_all": e}
            out[f"eager_alone_after_varied={use_varied}"] = statistics.median(time_steady(forward) for _ in range(20))
        plain, mine = host_pair(forward, lambda: cast.enabled(module))
        out["host_pair"] = {"eager": plain, "cast": mine}
    print(json.dumps({k: v for k, v in out.items()}, indent=1, default=str)[:3000], flush=True)
    with open(dest, "w") as f:
        json.dump(out, f, indent=1, default=str)


if __name__ == "__main__":
    main()
