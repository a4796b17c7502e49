# Issue 19's "never slower than torch.compile with confidence", measured across processes (written at the end of
# 2026-12-04c, not run): bench_compose --processes 3 on ResNet-50 and Gemma with their casts, and the SD3.5 VAE
# whose cast is faster under compile (the protocol must keep a real gain). About 9 minutes; setup as next.sh.
source .devrun/setup.sh
rm -rf /tmp/o; mkdir -p /tmp/o
R=docs/results/reproduce-h200
timeout 200 python3 scripts/bench_compose.py --out /tmp/o/resnet50 --model configs/models/resnet50.toml \
    --cast $R/2026-12-03g/resnet50/resnet50.cast --modes default,reduce-overhead --max-s 6 --processes 3 > /tmp/o/log8 2>&1; tail -5 /tmp/o/log8
timeout 170 python3 scripts/bench_compose.py --out /tmp/o/gemma --model configs/models/gemma4_e2b.toml \
    --cast $R/2026-12-04b/gemma4_e2b/gemma4_e2b.cast --modes default --max-s 6 --processes 3 > /tmp/o/log10 2>&1; tail -5 /tmp/o/log10
timeout $((575 - SECONDS)) python3 scripts/bench_compose.py --out /tmp/o/vae --model sd35_vae \
    --cast $R/2026-12-03b/sd35_vae/sd35_vae_compile.cast --modes default --max-s 6 --processes 2 > /tmp/o/log12 2>&1; tail -5 /tmp/o/log12
bash .devrun/pack.sh
