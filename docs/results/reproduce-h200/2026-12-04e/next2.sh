# Second command of the next GPU session (written at the end of 2026-12-04e, not run). About 4 minutes; setup as
# next.sh. The VAE's largest GroupNorm (bf16 [1,128,1024,1024], 268 MB in and out): the stream kernel with its
# statistics kept in L2 (`l2: keep`) and with at most 1 or 2 blocks per SM (`resident`; both new in 2026-12-04e:
# the default took 204-215 us, about three full passes at copy speed, so its second read missed the L2) beside
# the default stream kernels and split, each
# verified and timed in the lane against eager; the lane's copy of the same bytes is the bandwidth reference
# (the default stream kernel moved its bytes at ~70 % of it). Then the mixed-layout and route GPU tests stay as
# they are; nothing else changed in kernels.
source .devrun/setup.sh >/dev/null 2>&1
rm -rf /tmp/o; mkdir -p /tmp/o
export PYTHONPATH=$PYTHONPATH:$PWD/tests
timeout 280 python3 scripts/gpu_tests.py --out /tmp/o/gt --timeout 270 tests/test_builtin_gpu_norms.py \
    -k "bf16_1024" > /tmp/o/gt.log 2>&1; tail -4 /tmp/o/gt.log
cd /tmp && tar czf $OUT/o.tgz o
