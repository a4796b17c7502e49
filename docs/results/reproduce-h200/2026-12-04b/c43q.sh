# a Qwen3.5-35B-A3B sitting: eager target, export with --graph-routes, then bench_e2e and bench_compose
source .devrun/setup.sh >/dev/null; rm -rf /tmp/o /tmp/rep; mkdir -p /tmp/o
timeout $((585 - SECONDS)) python3 scripts/reproduce.py --out /tmp/rep --models qwen35_a3b --targets eager --graph-routes --wall-time 150 --deadline $((570 - SECONDS)) --pack /tmp/o/rep 2>&1 | tail -30
tar czf /tmp/o/rep_full.tgz --exclude='*.pt' --exclude='*.safetensors' --exclude='kforge.db*' -C /tmp/rep . 2>/dev/null
bash .devrun/pack.sh
