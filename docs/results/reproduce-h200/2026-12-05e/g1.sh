# 2026-12-05e, for the next device session's first call (~6 min): the spread busy runs (2a79345) on a GPU. The
# adversarial suite (class 7 should now be rejected; every honest kernel still verified), the timed tests, and the
# builtin proposer's GPU tests for the norms (their stream kernels wait on other blocks' counts: they must still
# verify with their blocks spread one per SM), then the graph-route GPU tests again.
source .devrun/setup.sh >/dev/null 2>&1
rm -rf /tmp/o; mkdir -p /tmp/o
export PYTHONPATH=$PYTHONPATH:$PWD/tests PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > /tmp/o/gpu.txt 2>&1
timeout 170 python3 -m pytest -q -s -n 0 tests/test_lane_adversarial.py -k lane_rejects > /tmp/o/adversarial.txt 2>&1
grep -E "^\[(7|12)\]" /tmp/o/adversarial.txt | cut -c1-200; grep -E "^E  +\[" /tmp/o/adversarial.txt | cut -c1-250; tail -1 /tmp/o/adversarial.txt
echo "t=$SECONDS"
left=$((560 - SECONDS)); [ $left -gt 30 ] && timeout $left python3 scripts/gpu_tests.py --out /tmp/o/gt tests/test_timed_gpu.py tests/test_builtin_gpu_norms.py > /tmp/o/gt.log 2>&1
tail -14 /tmp/o/gt/gpu_tests.md; echo "t=$SECONDS"
cd /tmp && tar czf $OUT/o.tgz o
