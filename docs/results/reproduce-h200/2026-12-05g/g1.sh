# 2026-12-05g, first call (~9.5 min): the fixes of 2026-12-05f on a GPU (the relu_ in-place audit, the C++ router's
# new source: self-test and ResNet-50 route), then the SD3.5 VAE's sitting from the pinned commit's code (.pin,
# tag sitting-2026-12-05g; reproduce.py --help says how), resumed by g2.sh on the same warm machine.
source .devrun/setup.sh >/dev/null 2>&1
rm -rf /tmp/o; mkdir -p /tmp/o
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > /tmp/o/gpu.txt 2>&1
run() {  # out-dir, -k text, file: each call's table lands in /tmp/o/<out-dir>/gpu_tests.md
  left=$((230 - SECONDS)); [ $left -gt 20 ] || return
  PYTHONPATH=$PYTHONPATH:$PWD/tests timeout $left python3 scripts/gpu_tests.py --out /tmp/o/$1 -k "$2" $3 >> /tmp/o/gt.log 2>&1
  tail -n +5 /tmp/o/$1/gpu_tests.md | cut -c1-250
}
run a elementwise_reference tests/test_builtin_gpu_a.py
run c router_self_test tests/test_cast_cpp_router.py
run d resnet50 tests/test_cast_cpp_router.py
echo "tests done t=$SECONDS"
left=$((575 - SECONDS))
(cd .pin && PYTHONPATH=/tmp/site:$PWD KFORGE_COMMIT=$(cat COMMIT) timeout $left python3 scripts/reproduce.py \
  --out /tmp/rep --models sd35_vae --deadline $((left - 15)) > /tmp/o/rep1.log 2>&1)
tail -4 /tmp/o/rep1.log; echo "t=$SECONDS"
cp -r /tmp/rep /tmp/o/; cd /tmp && tar czf $OUT/o.tgz o
