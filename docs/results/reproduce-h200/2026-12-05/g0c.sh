# 2026-12-05: run -> export -> audit -> load end to end under this session's lane and export changes
# (tests/test_run_gpu.py), then 2026-12-04g's g2 (channels-last twins after a biased convolution, op and chain
# twins) with what device time is left.
source .devrun/setup.sh >/dev/null 2>&1
rm -rf /tmp/o; mkdir -p /tmp/o
export PYTHONPATH=$PYTHONPATH:$PWD/tests PYTHONUNBUFFERED=1
timeout 230 python3 scripts/gpu_tests.py --out /tmp/o/gt-run --timeout 220 tests/test_run_gpu.py \
    > /tmp/o/gt-run.log 2>&1; grep -E "passed|failed|error" /tmp/o/gt-run.log | tail -6 | cut -c1-200
timeout 300 python3 scripts/gpu_tests.py --out /tmp/o/gt-twins --timeout 290 tests/test_layout_twins_gpu.py \
    > /tmp/o/gt-twins.log 2>&1; grep -E "passed|failed|error" /tmp/o/gt-twins.log | tail -6 | cut -c1-200
grep -hE "layout copies|biases_kept|inputs_as_held|outputs_copied" /tmp/o/gt-twins/logs/*.log | cut -c1-300 | head -12
cd /tmp && tar czf $OUT/o.tgz o
