# 2026-12-06g: the GPU tamper test again (e50856f: a launch spec naming a kernel the manifest does not is not
# prepared); on an H200 first the two measurements issues 19 and 20 name that card for (next-2026-12-07/go.sh's
# h200-vae and h200-e2e); then bias_probe.py on the VAE cast of vae-compose-2026-12-06b where time is left,
# and the tamper test's two failed cases; then the lane's adversarial suite and throughput (2026-12-06g changes).
# carry: .whl. Files: $OUT/g.tgz. LIMIT: seconds for this call (default 560).
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests PYTHONUNBUFFERED=1
LIMIT=${LIMIT:-560}; G=/tmp/g; mkdir -p $G; trap 'tar czf $OUT/g.tgz -C /tmp g' EXIT
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,clocks.max.sm --format=csv > $G/gpu.txt 2>&1; cat $G/gpu.txt
git rev-parse HEAD > $G/commit.txt 2>/dev/null
SD=docs/results/sd35-bias-2026-12-06e; VAE=docs/results/vae-compose-2026-12-06b/sd35_vae.cast
stamp() { echo "$(date +%T) t=$SECONDS $*" | tee -a $G/calls.txt; }
step() {  # step NAME NEEDS_S CMD...
  local name=$1 need=$2; shift 2; [ -e $G/$name.done ] && return 0
  local left=$((LIMIT - SECONDS)); [ $left -ge $need ] || { stamp "$name: $left s left, needs $need"; return 0; }
  stamp "$name"; mkdir -p $G/$name
  timeout -s INT -k 15 $((left - 15)) "$@" > $G/$name/log.txt 2>&1; local rc=$?; stamp "$name rc=$rc"
  [ $rc = 0 ] && touch $G/$name.done; grep -v Warning $G/$name/log.txt | tail -12 | cut -c1-400
}
if grep -q H200 $G/gpu.txt; then
  step h200-vae 280 python3 scripts/bench_compose.py --out $G/h200-vae --model configs/examples/sd35_vae.toml \
    --cast $VAE --modes default --max-s 20 --processes 2
  step h200-e2e 150 python3 scripts/bench_e2e.py --out $G/h200-e2e --casts $SD --models sd35_medium
fi
step probe 150 python3 docs/results/vae-bias-2026-12-06g/bias_probe.py $VAE $G/probe
step tests 100 python3 scripts/gpu_tests.py --out $G/tests --timeout 120 tests/test_cast_tamper_gpu.py \
  -k "no kernels"
# Then the lane's GPU checks changed on 2026-12-06g (no GPU has run them): the adversarial suite (state-keeping
# cheats now refused at compile, the class-7 race sleeping instead of reading the clock), the verification
# hardening of the stored sets (digests checked after timing in the worker) and the lane's throughput with them.
step adversarial 240 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/test_lane_adversarial.py
step lane 200 python3 scripts/bench_lane.py --skip-models --out $G/lane

