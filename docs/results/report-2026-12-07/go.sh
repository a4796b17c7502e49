# The next device session's first call (2026-12-07's code, CPU-tested only): the conv-bias fold on the GPU, and
# the timing changes (settle, host load) on the ViT-B/16 whose bench_e2e read a false 1.441x. carry: .whl.
# Files: $OUT/g.tgz. LIMIT (default 560). Resumable on the same warm machine (steps done are skipped).
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests PYTHONUNBUFFERED=1
LIMIT=${LIMIT:-560}; G=/tmp/g; mkdir -p $G; trap 'tar czf $OUT/g.tgz -C /tmp g' EXIT
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,clocks.max.sm --format=csv > $G/gpu.txt 2>&1; cat $G/gpu.txt
git rev-parse HEAD > $G/commit.txt 2>/dev/null
stamp() { echo "$(date +%T) t=$SECONDS $*" | tee -a $G/calls.txt; }
step() {  # step NAME NEEDS_S CMD...
  local name=$1 need=$2; shift 2; [ -e $G/$name.done ] && return 0
  local left=$((LIMIT - SECONDS)); [ $left -ge $need ] || { stamp "$name: $left s left, needs $need"; return 0; }
  stamp "$name"; mkdir -p $G/$name
  timeout -s INT -k 15 $((left - 15)) "$@" > $G/$name/log.txt 2>&1; local rc=$?; stamp "$name rc=$rc"
  [ $rc = 0 ] && touch $G/$name.done; grep -v Warning $G/$name/log.txt | tail -12 | cut -c1-400
}
# the fold's kernels verified in a lane, VAE-sized, beside the plain chain's time
step lane 120 python3 scripts/gpu_tests.py --out $G/lane --timeout 240 -k bias_add tests/test_builtin_chains_gpu.py
# (the split / match / restore on CUDA, tests/test_conv_bias_fold_pattern_gpu.py, passed on the H100 of 2026-12-07d)
# the user's path: run, export --target compile, cast.compile; the fold twin takes conv1's output as held
step twins 240 python3 scripts/gpu_tests.py --out $G/twins --timeout 400 tests/test_layout_twins_gpu.py
# ViT-B/16 again with the timing changes: eager settled first, the host recorded; bench_e2e's eager median
# should now meet bench_compose's eager pair (3.54 ms on the H100 of 2026-12-07)
VIT=docs/results/report-2026-12-07/h100-2026-12-07/vit_b16
step vit 120 python3 scripts/bench_e2e.py --out $G/vit --casts $VIT --models configs/examples/vit_b16.toml --no-host-cost
