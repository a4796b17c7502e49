# v1.sh for a short budget: the same steps, results written under $OUT as they come (a call cut short by its time
# limit still brings back what finished), the cast GPU tests only while LIMIT (seconds, default 570) lasts.
# Order: the on-device draws (~40 s), ab.sh (~3 min, needs .pin and .pin-old), then the cast GPU tests.
source .devrun/setup.sh >/dev/null 2>&1
LIMIT=${LIMIT:-570}
rm -rf /tmp/o; mkdir -p $OUT/o; ln -sfn $OUT/o /tmp/o; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > /tmp/o/gpu.txt 2>&1; cat /tmp/o/gpu.txt
PYTHONPATH=$PYTHONPATH:$PWD/tests timeout 100 python3 scripts/gpu_tests.py --out /tmp/o/a tests/test_inputs_on_device.py > /tmp/o/gt-a.log 2>&1
tail -n +5 /tmp/o/a/gpu_tests.md | cut -c1-200
[ -d .pin-old ] && bash docs/results/reproduce-h200/2026-12-05h/ab.sh
left=$((LIMIT - SECONDS))
[ $left -gt 30 ] && PYTHONPATH=$PYTHONPATH:$PWD/tests timeout $left python3 scripts/gpu_tests.py --out /tmp/o/b \
  tests/test_cast_compile_gpu.py tests/test_gn_op_and_pattern_gpu.py tests/test_cast_gpu.py > /tmp/o/gt-b.log 2>&1
tail -n +5 /tmp/o/b/gpu_tests.md 2>/dev/null | cut -c1-200; echo "t=$SECONDS"
