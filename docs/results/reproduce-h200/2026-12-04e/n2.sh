# 2026-12-04e, second command: the decoding-step GPU test, then the SD3.5 VAE's compile-target cast under
# torch.compile default, 2 processes, --block 4 (as n1.sh).
source .devrun/setup.sh
rm -rf /tmp/o; mkdir -p /tmp/o
R=docs/results/reproduce-h200
export PYTHONPATH=$PYTHONPATH:$PWD/tests
timeout 80 python3 scripts/gpu_tests.py --out /tmp/o/gt --timeout 75 tests/test_decode_step_gpu.py > /tmp/o/gt.log 2>&1; tail -3 /tmp/o/gt.log
timeout $((420 - SECONDS)) python3 scripts/bench_compose.py --out /tmp/o/vae --model sd35_vae \
    --cast $R/2026-12-03b/sd35_vae/sd35_vae_compile.cast --modes default --max-s 6 --processes 2 --block 4 \
    > /tmp/o/vae.log 2>&1; grep -E "vs alone" /tmp/o/vae.log | tail -3
[ -f /tmp/o/vae/bench_compose.json ] || python3 scripts/bench_compose.py --out /tmp/o/vae --pool-only
cd /tmp && tar czf $OUT/o.tgz o
