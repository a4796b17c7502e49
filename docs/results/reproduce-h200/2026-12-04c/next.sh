# For the next GPU session (written at the end of 2026-12-04c, not run): what this session built after its
# device time was spent. Copy setup.sh and pack.sh of 2026-12-04b to .devrun/ (with the wheelhouse in .whl/),
# then   bash docs/results/reproduce-h200/2026-12-04c/next.sh        (about 9 minutes)
source .devrun/setup.sh
rm -rf /tmp/o; mkdir -p /tmp/o
export PYTHONPATH=$PYTHONPATH:$PWD/tests
# 1. the revised tiled kernel for mixed layouts (64 x 64 tiles, direct loads in flight with the tiled ones):
#    Whisper's residual and position adds; the 32 x 32 tile read 47.8 and 38.5 us, copy ~18, Inductor 20.3
timeout 120 python3 -m pytest -q -s -n 0 tests/test_builtin_gpu_a.py -k mixed_layouts 2>&1 | grep -v Warn | tee /tmp/o/mixed_layouts.log | tail -14
# 2. graph routes with tensor attributes and global tensors guarded: the route GPU tests again
timeout 100 python3 scripts/gpu_tests.py --out /tmp/o/gt --timeout 60 tests/test_cast_graph_routes_gpu.py 2>&1 | tail -6
# 3. decode with a static cache through graph routes that take the cache as a state object (opt-in, CPU-tested
#    only): Qwen3.5 4-layer, eager vs routed generate(), ms per token and whether the tokens are the same
timeout 200 python3 scripts/bench_decode.py --out /tmp/o/decode --model configs/models/qwen35_a3b.toml \
    --prompt 128 --tokens 32 --rounds 3 2>&1 | tail -8
# 4. a whisper_encoder sitting: does the search now find a faster kernel for the mixed-layout adds?
timeout $((585 - SECONDS)) python3 scripts/reproduce.py --out /tmp/rep --models whisper_encoder --targets eager \
    --wall-time 100 --deadline $((560 - SECONDS)) --pack /tmp/o/rep 2>&1 | grep -v Warn | tail -6
bash .devrun/pack.sh
