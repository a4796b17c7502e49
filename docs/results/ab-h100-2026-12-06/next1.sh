# First call of the next device session (any card; carry .whl .devrun): the GPU tests 2026-12-06 did not reach, first
# the chains test (module route in eager, pattern op under cast.compile: the op is a torch.library definition since
# 791aca6), written under $OUT as they finish. ~6 min. LIMIT: seconds for all of it (default 560).
source .devrun/setup.sh >/dev/null 2>&1
LIMIT=${LIMIT:-560}; export PYTHONUNBUFFERED=1 PYTHONPATH=$PYTHONPATH:$PWD/tests
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $OUT/gpu.txt 2>&1; cat $OUT/gpu.txt
run() {  # run OUTDIR [-k TEXT] FILE
  left=$((LIMIT - SECONDS)); [ $left -gt 30 ] || { echo "no time left for $*"; return; }
  timeout $left python3 scripts/gpu_tests.py --timeout $left --out $OUT/$1 "${@:2}" > $OUT/$1.log 2>&1
  tail -n +5 $OUT/$1/gpu_tests.md 2>/dev/null | cut -c1-220
}
run chains tests/test_run_chains_gpu.py
run vae-graphs -k "replay[sd35_vae]" tests/test_cast_gpu.py
run host-cost -k host_cost_probe tests/test_cast_gpu.py
echo "t=$SECONDS"
