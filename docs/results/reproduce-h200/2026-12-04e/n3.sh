# 2026-12-04e, third command: the cast-under-compile GPU tests, the passthrough's included.
source .devrun/setup.sh >/dev/null 2>&1
rm -rf /tmp/o; mkdir -p /tmp/o
export PYTHONPATH=$PYTHONPATH:$PWD/tests
timeout 150 python3 scripts/gpu_tests.py --out /tmp/o/gt --timeout 140 tests/test_cast_compile_gpu.py > /tmp/o/gt.log 2>&1; tail -6 /tmp/o/gt.log
cd /tmp && tar czf $OUT/o.tgz o
