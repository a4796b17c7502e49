# graph routes on the GPU: their test, then the auto trials on Gemma and Qwen
source .devrun/setup.sh
rm -rf /tmp/o; mkdir -p /tmp/o
timeout 200 python3 scripts/gpu_tests.py --out /tmp/o/gt42 --timeout 150 tests/test_cast_graph_routes_gpu.py 2>&1 | tail -15
echo "tests done at $SECONDS"
timeout 190 python3 scripts/bench_graph_routes.py --out /tmp/o/gr_gemma --model configs/models/gemma4_e2b.toml --modules auto --tries 3 --max-s 15 2>&1 | tail -15
cat /tmp/o/gr_gemma/bench_graph_routes.md
echo "gemma done at $SECONDS"
timeout $((570 - SECONDS)) python3 scripts/bench_graph_routes.py --out /tmp/o/gr_qwen --model configs/models/qwen35_a3b.toml --modules auto --tries 3 --max-s 15 2>&1 | tail -15
cat /tmp/o/gr_qwen/bench_graph_routes.md
echo "qwen done at $SECONDS"
bash .devrun/pack.sh
