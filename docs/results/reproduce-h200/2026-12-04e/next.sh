# For the next GPU session (written at the end of 2026-12-04e, not run). Setup as 2026-12-04d/next.sh. About 9
# minutes: the cast-under-compile GPU tests that did not run (the first test builds the router extension, ~90 s),
# then ResNet-50 in default mode with --block 4 --control: which of the install, the wrapper or the GC carries
# the ~2 % its eager-only cast still read in one process of 2026-12-04e.
source .devrun/setup.sh >/dev/null 2>&1
rm -rf /tmp/o; mkdir -p /tmp/o
R=docs/results/reproduce-h200
export PYTHONPATH=$PYTHONPATH:$PWD/tests
timeout 240 python3 scripts/gpu_tests.py --out /tmp/o/gt --timeout 200 tests/test_cast_compile_gpu.py > /tmp/o/gt.log 2>&1; tail -5 /tmp/o/gt.log
timeout $((560 - SECONDS)) python3 scripts/bench_compose.py --out /tmp/o/resnet50 --model configs/models/resnet50.toml \
    --cast $R/2026-12-03g/resnet50/resnet50.cast --modes default --max-s 8 --block 4 --control \
    > /tmp/o/resnet50.log 2>&1; grep -E "control arms|verdict|vs alone" /tmp/o/resnet50.log | tail -4
# The router extension this machine built (about 90 s of the first GPU test): unpack it into .devrun/ext here,
# and setup.sh copies it to TORCH_EXTENSIONS_DIR on the next fresh machine (same torch, same build flags).
[ -d /tmp/ext ] && tar czf /tmp/o/ext.tgz -C /tmp ext
cd /tmp && tar czf $OUT/o.tgz o
