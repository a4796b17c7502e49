# 2026-12-04g (prepared in the thirty-fifth session, which had no device): the GroupNorm kernels. The persist
# strategy (count two ahead, gpi; never run) beside stream on the VAE's largest GroupNorm, then on the VAE's
# other GroupNorms larger than half the L2 plus the CUDA-graph capture of a cooperative launch (`-k persist`),
# then the channels-last kernels' flat apply pass beside the tiled one (`-k channels_last`). At most 9 minutes.
# Setup as 2026-12-04e/next.sh (carry .whl and .devrun; the C++ router's extension rebuilds once, ~90 s).
source .devrun/setup.sh >/dev/null 2>&1
rm -rf /tmp/o; mkdir -p /tmp/o
export PYTHONPATH=$PYTHONPATH:$PWD/tests
for k in bf16_1024 persist channels_last; do
  timeout 175 python3 scripts/gpu_tests.py --out /tmp/o/gt-$k --timeout 170 tests/test_builtin_gpu_norms.py \
      -k $k > /tmp/o/gt-$k.log 2>&1; tail -3 /tmp/o/gt-$k.log
done
grep -hE "^group_norm|persist|stream|split|channels-last|flat|tile" /tmp/o/gt-*/logs/*.log | grep -v "^tests" | cut -c1-230
cd /tmp && tar czf $OUT/o.tgz o
