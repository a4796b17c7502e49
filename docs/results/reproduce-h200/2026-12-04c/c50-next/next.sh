# For the next GPU session (written at the end of 2026-12-04b, not run): what this session built after its
# device time was spent. Copy setup.sh and pack.sh to .devrun/ (with the wheelhouse in .whl/), then
#   bash docs/results/reproduce-h200/2026-12-04b/next.sh        (about 8 minutes)
source .devrun/setup.sh
rm -rf /tmp/o; mkdir -p /tmp/o
D=docs/results/reproduce-h200/2026-12-04b
# 1. the per-class dispatcher (e8df579, 19a6d16) and routes of a whole model (9168f71) on the GPU
timeout 260 python3 scripts/gpu_tests.py --out /tmp/o/gt --timeout 120 tests/test_cast_graph_routes_gpu.py \
    tests/test_cast_compile_gpu.py tests/test_cast_gpu.py 2>&1 | tail -12
echo "tests done at $SECONDS"
# 2. Gemma and Qwen: the whole model is the first candidate now
for m in gemma4_e2b qwen35_a3b; do
  timeout 90 python3 scripts/bench_graph_routes.py --out /tmp/o/gr_$m --model configs/models/$m.toml --modules auto \
      --tries 2 --max-s 15 2>&1 | tail -3
done
echo "routes done at $SECONDS"
# 3. Gemma under torch.compile with its eager-only cast installed: the "cast installed" arm read 0.986 (c46)
timeout $((570 - SECONDS)) python3 scripts/bench_compose.py --out /tmp/o/ctl --model configs/models/gemma4_e2b.toml \
    --cast $D/gemma4_e2b/gemma4_e2b.cast --modes default --control --max-s 8 2>&1 | tail -4
bash .devrun/pack.sh
