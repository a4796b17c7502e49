# 2026-12-05e, first call: 2026-12-05d/g0f.sh (race_diag4: which streams overlap; the worker's contention
# self-check; the adversarial suite with the new input sets on the GPU's eager), then the GPU tests of the
# 39th session's guard changes that fit: torch.compile composition (patterns.py's first GPU run) and graph
# routes (NaN / -0.0 keys, default dtype). Every step is time-boxed so the tar at the end is always written.
source .devrun/setup.sh >/dev/null 2>&1
rm -rf /tmp/o; mkdir -p /tmp/o
export PYTHONPATH=$PYTHONPATH:$PWD/tests PYTHONUNBUFFERED=1
D=docs/results/reproduce-h200/2026-12-05d
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > /tmp/o/gpu.txt 2>&1
timeout 50 python3 $D/race_diag4.py driver > /tmp/o/diag4-driver.txt 2>&1
CUDA_DEVICE_MAX_CONNECTIONS=1 timeout 50 python3 $D/race_diag4.py driver > /tmp/o/diag4-driver-1.txt 2>&1
CUDA_DEVICE_MAX_CONNECTIONS=32 timeout 50 python3 $D/race_diag4.py driver > /tmp/o/diag4-driver-32.txt 2>&1
timeout 50 python3 $D/race_diag4.py pool > /tmp/o/diag4-pool.txt 2>&1
for f in /tmp/o/diag4-*.txt; do echo "== $f"; grep -E "^side|^overlap|#2|Error|Traceback|kforge lane" $f | cut -c1-260; done
echo "t=$SECONDS"
timeout 170 python3 -m pytest -q -s -n 0 tests/test_lane_adversarial.py -k lane_rejects > /tmp/o/adversarial.txt 2>&1
grep -E "^\[(7|12)\]" /tmp/o/adversarial.txt | cut -c1-200; grep -E "^E  +\[" /tmp/o/adversarial.txt | cut -c1-250; tail -1 /tmp/o/adversarial.txt
echo "t=$SECONDS"
left=$((560 - SECONDS)); [ $left -gt 30 ] && timeout $left python3 scripts/gpu_tests.py --out /tmp/o/gt tests/test_cast_graph_routes_gpu.py tests/test_cast_compile_gpu.py > /tmp/o/gt.log 2>&1
cat /tmp/o/gt/gpu_tests.md 2>/dev/null | tail -12; echo "t=$SECONDS"
cd /tmp && tar czf $OUT/o.tgz o
