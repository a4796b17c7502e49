# Second command of the next GPU session (written at the end of 2026-12-04d, not run): the SD3.5 VAE's
# compile-target cast over 3 processes (issue 19's >= 1.3x over torch.compile; 1.285x pooled over 2 in
# 2026-12-04d), after the decoding-step GPU test. About 6 minutes; setup as next.sh.
source .devrun/setup.sh
rm -rf /tmp/o; mkdir -p /tmp/o
R=docs/results/reproduce-h200
# a decoding step (engine/models/decode.py) replayed from a CUDA graph equals its eager run (about 30 s)
export PYTHONPATH=$PYTHONPATH:$PWD/tests
timeout 90 python3 scripts/gpu_tests.py --out /tmp/o/gt --timeout 80 tests/test_decode_step_gpu.py 2>&1 | tail -3
timeout $((560 - SECONDS)) python3 scripts/bench_compose.py --out /tmp/o/vae --model sd35_vae \
    --cast $R/2026-12-03b/sd35_vae/sd35_vae_compile.cast --modes default --max-s 6 --processes 3 \
    > /tmp/o/vae.log 2>&1; grep -E "vs alone|process" /tmp/o/vae.log | tail -6
[ -f /tmp/o/vae/bench_compose.json ] || python3 scripts/bench_compose.py --out /tmp/o/vae --pool-only
cd /tmp && tar czf $OUT/o.tgz o
