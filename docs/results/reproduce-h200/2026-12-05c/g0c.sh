# 2026-12-05c (thirty-eighth session, no device lent): the cast-side changes on the GPU. The C++ router's number
# keys (type and sign of Python scalars) and its deterministic-algorithms decline were built and tested at the
# CPU key only; routes copy as None, module cards check submodules and parameter metadata. Runs the router's
# self-test and the cast GPU tests, each in its own process. About 5 minutes.
source .devrun/setup.sh >/dev/null 2>&1
rm -rf /tmp/o; mkdir -p /tmp/o
export PYTHONPATH=$PYTHONPATH:$PWD/tests PYTHONUNBUFFERED=1
timeout 280 python3 scripts/gpu_tests.py --out /tmp/o/gt-cast --timeout 150 tests/test_cast_cpp_router.py \
    tests/test_cast_gpu.py tests/test_cast_graph_routes_gpu.py > /tmp/o/gt-cast.log 2>&1; tail -4 /tmp/o/gt-cast.log
timeout 200 python3 scripts/gpu_tests.py --out /tmp/o/gt-layout --timeout 190 tests/test_layout_routes_gpu.py \
    > /tmp/o/gt-layout.log 2>&1; tail -3 /tmp/o/gt-layout.log
cd /tmp && tar czf $OUT/o.tgz o
