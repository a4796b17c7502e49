# 2026-12-07 (next device session): attention routes (ce9cc27, CPU-tested only) on the GPU, then the SD3.5 VAE under
# torch.compile with its cast and its mid-block attention proven in the math form by the export's own check (issue
# 20's >= 1.6x; the probe read 1.536x on an H100, h100-2026-12-07/). carry: .whl. Files: $OUT/h2.tgz. LIMIT
# (default 560). Resumable on the same warm machine (steps done are skipped).
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests PYTHONUNBUFFERED=1
LIMIT=${LIMIT:-560}; G=/tmp/h2; mkdir -p $G; trap 'tar czf $OUT/h2.tgz -C /tmp h2' EXIT
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,clocks.max.sm --format=csv > $G/gpu.txt 2>&1; cat $G/gpu.txt
git rev-parse HEAD > $G/commit.txt 2>/dev/null
VAE=docs/results/vae-compose-2026-12-06b/sd35_vae.cast
stamp() { echo "$(date +%T) t=$SECONDS $*" | tee -a $G/calls.txt; }
step() {  # step NAME NEEDS_S CMD...
  local name=$1 need=$2; shift 2; [ -e $G/$name.done ] && return 0
  local left=$((LIMIT - SECONDS)); [ $left -ge $need ] || { stamp "$name: $left s left, needs $need"; return 0; }
  stamp "$name"; mkdir -p $G/$name
  timeout -s INT -k 15 $((left - 15)) "$@" > $G/$name/log.txt 2>&1; local rc=$?; stamp "$name rc=$rc"
  [ $rc = 0 ] && touch $G/$name.done; grep -v Warning $G/$name/log.txt | tail -12 | cut -c1-400
}
step attgpu 120 python3 scripts/gpu_tests.py --out $G/attgpu --timeout 240 tests/test_attention_routes_gpu.py
# the export's check on the full-size VAE with its cast: signatures found, both compiles, output judged, timed
step attcheck 150 python3 -m engine.export.attention_check --config configs/examples/sd35_vae.toml --cast $VAE \
  --out $G/attcheck/r.json --modes default
# the cast written again with what the check kept, then bench_compose of it (one process)
step routed 20 python3 -c "
import json, sys; from pathlib import Path; from engine.export.attention_check import with_routes
r = json.loads(Path('$G/attcheck/r.json').read_text()); r = r.get('result', r)
print(json.dumps(r.get('tried'), indent=1)); assert r.get('targets'), 'nothing kept'
with_routes('$VAE', r['signatures'], r['targets'], Path('$G/routed/sd35_vae_attn.cast'))"
[ -e $G/routed.done ] && step compose 190 python3 scripts/bench_compose.py --out $G/compose \
  --model configs/examples/sd35_vae.toml --cast $G/routed/sd35_vae_attn.cast --modes default --max-s 20
step twins 150 python3 scripts/gpu_tests.py --out $G/twins --timeout 240 tests/test_layout_twins_gpu.py
# on an H200: issue 19's bench_compose of the committed split rule over two processes (never run on an H200)
grep -q H200 $G/gpu.txt && step vae-h200 280 python3 scripts/bench_compose.py --out $G/vae-h200 \
  --model configs/examples/sd35_vae.toml --cast $VAE --modes default --max-s 20 --processes 2
