# Gemma 4 E2B and Qwen3.5 at their real depth (35 and 40 layers) with the casts 2026-12-04b exported (module
# cards + decoder-layer graph routes), at this commit (per-class dispatcher). bench_e2e: eager vs cast, CUDA
# graphs, host time per forward.
source .devrun/setup.sh
rm -rf /tmp/o; mkdir -p /tmp/o/gemma /tmp/o/qwen
B=docs/results/reproduce-h200/2026-12-04b
timeout 330 python3 scripts/bench_e2e.py --out /tmp/o/gemma --casts $B/gemma4_e2b --models gemma4_e2b,gemma4_e2b@full_depth=true --no-host-cost 2>&1 | grep -v Warn | tail -8
echo "gemma done at $SECONDS"
timeout $((575 - SECONDS)) python3 scripts/bench_e2e.py --out /tmp/o/qwen --casts $B/qwen35_a3b --models qwen35_a3b@full_depth=true --no-host-cost 2>&1 | grep -v Warn | tail -8
echo "qwen done at $SECONDS"
bash .devrun/pack.sh
