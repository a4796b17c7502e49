# The next device session's first call: what changed since the last GPU run and ran only on the CPU. carry: .whl.
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
# (done on the H100 of 2026-12-07e, h100-2026-12-07e/: the fold's lane test, the twins' four GPU tests)
# the C++ router with its slimmer includes (7f51eba): it builds again on the GPU (-O2 -g) and serves ResNet-50's cast
step router 150 python3 scripts/gpu_tests.py --out $G/router --timeout 300 tests/test_cast_cpp_router.py tests/test_cpp_router_selftest.py
# ViT-B/16 under reduce-overhead read 0.990x (0.986-0.992) with a cast that has nothing for that mode (one compiled
# function for both arms; h100-2026-12-07e): the control arms say whether the installed cast or the timing costs it
VIT=docs/results/report-2026-12-07/h100-2026-12-07e/vit_b16
step vitctl 150 python3 scripts/bench_compose.py --out $G/vitctl --model configs/examples/vit_b16.toml --cast $VIT/vit_b16.cast --modes reduce-overhead --control
