# the graph-route GPU tests after the gapped-output fix, then a Gemma sitting: eager target with --graph-routes
source .devrun/setup.sh
rm -rf /tmp/o /tmp/rep; mkdir -p /tmp/o
timeout 100 python3 scripts/gpu_tests.py --out /tmp/o/gt44 --timeout 90 tests/test_cast_graph_routes_gpu.py 2>&1 | tail -6
echo "tests done at $SECONDS"
timeout $((585 - SECONDS)) python3 scripts/reproduce.py --out /tmp/rep --models gemma4_e2b --targets eager --graph-routes --wall-time 150 --deadline $((572 - SECONDS)) --pack /tmp/o/rep 2>&1 | tail -14
echo "elapsed $SECONDS"
tar czf /tmp/o/rep_full.tgz --exclude='*.pt' --exclude='*.safetensors' --exclude='kforge.db*' -C /tmp/rep . 2>/dev/null
bash .devrun/pack.sh
