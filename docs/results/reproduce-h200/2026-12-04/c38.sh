# next session, first command: the balanced control on ResNet-50, then the compile GPU tests at this commit
source .devrun/setup.sh
export KFORGE_CAST_DIR=/tmp/casts
rm -rf /tmp/o/*; timeout 330 python3 scripts/bench_compose.py --out /tmp/o/rc38 --model configs/models/resnet50.toml --cast docs/results/reproduce-h200/2026-12-03g/resnet50/resnet50.cast --modes default,reduce-overhead --control --max-s 20 2>&1 | tail -16
echo "bench done at $SECONDS"
timeout $((585 - SECONDS)) python3 scripts/gpu_tests.py --out /tmp/o/gt38 --timeout 160 tests/test_cast_compile_gpu.py tests/test_gn_op_and_pattern_gpu.py 2>&1 | tail -8
echo "elapsed $SECONDS"
bash .devrun/pack.sh
