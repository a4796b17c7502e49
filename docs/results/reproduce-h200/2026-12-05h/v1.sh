# 2026-12-05h, late in the session (~9.5 min): the GPU tests of the code this session changed, and the channels-last
# GroupNorm A/B. Order: the on-device draws, ab.sh (~3 min, needs .pin and .pin-old), then the cast GPU tests that
# cover the module, pattern and op-route changes (test_cast_compile_gpu, test_gn_op_and_pattern_gpu, test_cast_gpu),
# each test its own process (scripts/gpu_tests.py), until the call's time is spent.
source .devrun/setup.sh >/dev/null 2>&1
rm -rf /tmp/o; mkdir -p /tmp/o; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > /tmp/o/gpu.txt 2>&1; cat /tmp/o/gpu.txt
PYTHONPATH=$PYTHONPATH:$PWD/tests timeout 100 python3 scripts/gpu_tests.py --out /tmp/o/a tests/test_inputs_on_device.py > /tmp/o/gt-a.log 2>&1
tail -n +5 /tmp/o/a/gpu_tests.md | cut -c1-200
bash docs/results/reproduce-h200/2026-12-05h/ab.sh
left=$((570 - SECONDS))
PYTHONPATH=$PYTHONPATH:$PWD/tests timeout $left python3 scripts/gpu_tests.py --out /tmp/o/b tests/test_cast_compile_gpu.py \
  tests/test_gn_op_and_pattern_gpu.py tests/test_cast_gpu.py > /tmp/o/gt-b.log 2>&1
tail -n +5 /tmp/o/b/gpu_tests.md | cut -c1-200; echo "t=$SECONDS"
cd /tmp && tar czf $OUT/o.tgz o
