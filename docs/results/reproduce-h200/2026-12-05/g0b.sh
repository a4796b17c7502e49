# 2026-12-05: (1) why the adversarial class-7 race is not exposed by the lane's contention (race_diag.py here:
# wrong rows alone, beside the worker's hog, beside fixed hogs); (2) builtin kernels under this session's
# verification (stale run, poisoned workspaces, scrubbing, validated sets): the norm templates in the lane, and
# run -> export -> audit end to end (export's whole-model check now runs eager twice).
source .devrun/setup.sh >/dev/null 2>&1
rm -rf /tmp/o; mkdir -p /tmp/o
export PYTHONPATH=$PYTHONPATH:$PWD/tests PYTHONUNBUFFERED=1
timeout 90 python3 docs/results/reproduce-h200/2026-12-05/race_diag.py > /tmp/o/race_diag.txt 2>&1; cut -c1-200 /tmp/o/race_diag.txt | grep -v Warn
timeout 420 python3 scripts/gpu_tests.py --out /tmp/o/gt --timeout 200 tests/test_builtin_gpu_norms.py tests/test_run_gpu.py \
    > /tmp/o/gt.log 2>&1; grep -E "passed|failed|error" /tmp/o/gt.log | tail -14
cd /tmp && tar czf $OUT/o.tgz o
