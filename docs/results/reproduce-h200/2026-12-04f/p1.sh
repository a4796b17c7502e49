# 2026-12-04f, first command after next.sh/next2.sh/next3.sh of 2026-12-04e. The GroupNorm persist strategy
# (one cooperative launch; every block keeps its slice of two groups in shared memory): the VAE's largest
# GroupNorm beside the stream kernel, then the VAE's other GroupNorms larger than half the L2 (and, from 2420244
# on, a cooperative launch captured in a CUDA graph: `-k persist` takes both). Setup as 2026-12-04e/next.sh.
source .devrun/setup.sh >/dev/null 2>&1
rm -rf /tmp/o; mkdir -p /tmp/o
export PYTHONPATH=$PYTHONPATH:$PWD/tests
timeout 200 python3 scripts/gpu_tests.py --out /tmp/o/gt --timeout 190 tests/test_builtin_gpu_norms.py \
    -k bf16_1024 > /tmp/o/gt.log 2>&1; tail -3 /tmp/o/gt.log
timeout 300 python3 scripts/gpu_tests.py --out /tmp/o/gt2 --timeout 290 tests/test_builtin_gpu_norms.py \
    -k persist > /tmp/o/gt2.log 2>&1; tail -6 /tmp/o/gt2.log
grep -hE "^group_norm|persist|stream|split" /tmp/o/gt*/logs/*.log | grep -v "^tests" | cut -c1-230
cd /tmp && tar czf $OUT/o.tgz o
