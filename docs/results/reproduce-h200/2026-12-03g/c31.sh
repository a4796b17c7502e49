source .devrun/setup.sh
export KFORGE_CAST_DIR=/tmp/casts
( timeout 170 python3 scripts/gpu_tests.py --out /tmp/o/gt31a --timeout 160 tests/test_layout_twins_gpu.py ;
  timeout 200 python3 scripts/gpu_tests.py --out /tmp/o/gt31b --timeout 120 tests/test_cast_cpp_router.py tests/test_cast_compile_gpu.py ) 2>&1 | tail -20
echo "tests done at $SECONDS"
source .devrun/rep.sh
