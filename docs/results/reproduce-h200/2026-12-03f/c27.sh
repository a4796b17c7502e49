source .devrun/setup.sh
export KFORGE_CAST_DIR=/tmp/casts
( timeout 170 python3 scripts/gpu_tests.py --out /tmp/o/gt27a --timeout 160 tests/test_layout_twins_gpu.py ;
  timeout 200 python3 scripts/gpu_tests.py --out /tmp/o/gt27b --timeout 120 tests/test_cast_cpp_router.py tests/test_cast_compile_gpu.py ) 2>&1 | tail -20
echo "tests done at $SECONDS"
timeout $((575 - SECONDS)) python3 scripts/reproduce.py --out /tmp/rep --models sd35_medium --ops group_norm --targets compile --wall-time 240 --deadline $((565 - SECONDS)) --pack /tmp/o/rep 2>&1 | tail -25
echo "elapsed $SECONDS"
bash .devrun/pack.sh
