# 2026-12-05f, for the next device session's first call (~9 min): the two fixes of this session on a GPU, then
# the GPU tests the last calls' limits cut. (1) test_builtin_gpu_a's elementwise test (its relu_ kernels were called
# cheating by the timed audits' in-place bug, fixed in 56dae9b); (2) the channels-last GroupNorm twins (the harness
# dropped the twin's outputs, a6f23db); (3) chain lane, capture and GroupNorm op/pattern tests; (4) the C++ router
# (new source: rebinding a deregistered original, 1eba405) self-test and ResNet-50 route.
source .devrun/setup.sh >/dev/null 2>&1
rm -rf /tmp/o; mkdir -p /tmp/o
export PYTHONPATH=$PYTHONPATH:$PWD/tests PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > /tmp/o/gpu.txt 2>&1
run() {  # out-dir, -k text, file: each call's table lands in /tmp/o/<out-dir>/gpu_tests.md
  left=$((550 - SECONDS)); [ $left -gt 20 ] || return
  timeout $left python3 scripts/gpu_tests.py --out /tmp/o/$1 -k "$2" $3 >> /tmp/o/gt.log 2>&1
  tail -n +5 /tmp/o/$1/gpu_tests.md | cut -c1-250
}
run a elementwise_reference tests/test_builtin_gpu_a.py
run b "channels_last[(1, 128" tests/test_builtin_gpu_norms.py
run c router_self_test tests/test_cast_cpp_router.py
run d resnet50 tests/test_cast_cpp_router.py
run e "" tests/test_chain_lane_gpu.py
run f "" tests/test_gn_op_and_pattern_gpu.py
run g "" tests/test_capture_gpu.py
run h "channels_last[(1, 512" tests/test_builtin_gpu_norms.py
run i "channels_last[(2" tests/test_builtin_gpu_norms.py
echo "t=$SECONDS"
cd /tmp && tar czf $OUT/o.tgz o
