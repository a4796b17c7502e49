# 2026-12-04g: channels-last twins under torch.compile after a BIASED convolution (the convolution keeps its
# bias for the cast's op: `biases_kept`) with the GroupNorm op variants, then with the GroupNorm -> SiLU chain
# twins (their output channels-last for the next convolution: nothing copied back on torch 2.11); and the
# unbiased case as before. About 6 minutes (three run + export + compile sittings of a small model).
source .devrun/setup.sh >/dev/null 2>&1
rm -rf /tmp/o; mkdir -p /tmp/o
export PYTHONPATH=$PYTHONPATH:$PWD/tests
timeout 560 python3 scripts/gpu_tests.py --out /tmp/o/gt-twins --timeout 280 tests/test_layout_twins_gpu.py \
    > /tmp/o/gt-twins.log 2>&1; tail -5 /tmp/o/gt-twins.log
grep -hE "layout copies|speedup|twin" /tmp/o/gt-twins/logs/*.log | cut -c1-400 | head -20
cd /tmp && tar czf $OUT/o.tgz o
