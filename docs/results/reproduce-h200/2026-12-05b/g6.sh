# 2026-12-05b, everything in one call (device starts were scarce: about 15 minutes left, each failed start cost
# 90 s): the layout route on a bf16 resnet stack (tests/test_layout_routes_gpu.py, first test), the layout probe
# on the SD3.5 VAE (no cast), then the VAE's eager-only sitting (run 120 s on its GroupNorm cards, export --target
# eager with the layout-route check, bench_e2e) in what is left.
source .devrun/setup.sh >/dev/null 2>&1
rm -rf /tmp/o; mkdir -p /tmp/o
export PYTHONPATH=$PYTHONPATH:$PWD/tests PYTHONUNBUFFERED=1
timeout 100 python3 scripts/gpu_tests.py --out /tmp/o/gt-layout --timeout 95 tests/test_layout_routes_gpu.py -k stack \
    > /tmp/o/gt-layout.log 2>&1; tail -2 /tmp/o/gt-layout.log
grep -h "layout-" /tmp/o/gt-layout/logs/*.log | cut -c1-250
timeout 90 python3 scripts/probe_conv_layout.py --config configs/examples/sd35_vae.toml --out /tmp/o/layout > /tmp/o/layout-vae.log 2>&1
head -3 /tmp/o/layout-vae.log | cut -c1-250
timeout 390 python3 scripts/reproduce.py --out /tmp/rep --models sd35_vae --targets eager --wall-time 120 \
    --no-graph-routes --deadline 375 > /tmp/o/rep.log 2>&1
tail -6 /tmp/o/rep.log
cp -r /tmp/rep /tmp/o/; find /tmp/o -name "*.cast" -size +16M -delete; find /tmp/o -name "kforge.db*" -size +30M -delete
cd /tmp && tar czf $OUT/o.tgz o
