# Second command of the next GPU session (written at the end of 2026-12-04d, not run): the SD3.5 VAE's
# compile-target cast over 3 processes (issue 19's >= 1.3x over torch.compile; 1.285x pooled over 2 in
# 2026-12-04d). About 5 minutes; setup as next.sh.
source .devrun/setup.sh
rm -rf /tmp/o; mkdir -p /tmp/o
R=docs/results/reproduce-h200
timeout 560 python3 scripts/bench_compose.py --out /tmp/o/vae --model sd35_vae \
    --cast $R/2026-12-03b/sd35_vae/sd35_vae_compile.cast --modes default --max-s 6 --processes 3 \
    > /tmp/o/vae.log 2>&1; grep -E "vs alone|process" /tmp/o/vae.log | tail -6
[ -f /tmp/o/vae/bench_compose.json ] || python3 scripts/bench_compose.py --out /tmp/o/vae --pool-only
cd /tmp && tar czf $OUT/o.tgz o
