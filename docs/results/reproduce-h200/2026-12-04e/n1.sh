# 2026-12-04e, first command: ResNet-50 and Gemma 4 E2B (4 layers) with their eager-only casts under torch.compile
# (the passthrough: one compile, torch.compile's own), timed with --block 4 (per turn of an arm: one install, a GC,
# a warm call, 4 timed calls back to back; the turn's sample their median), 2 processes each.
source .devrun/setup.sh
rm -rf /tmp/o; mkdir -p /tmp/o
R=docs/results/reproduce-h200
timeout 250 python3 scripts/bench_compose.py --out /tmp/o/resnet50 --model configs/models/resnet50.toml \
    --cast $R/2026-12-03g/resnet50/resnet50.cast --modes default,reduce-overhead --max-s 5 --processes 2 --block 4 \
    > /tmp/o/resnet50.log 2>&1; grep -E "vs alone" /tmp/o/resnet50.log | tail -3
timeout $((520 - SECONDS)) python3 scripts/bench_compose.py --out /tmp/o/gemma --model configs/models/gemma4_e2b.toml \
    --cast $R/2026-12-04b/gemma4_e2b/gemma4_e2b.cast --modes default --max-s 6 --processes 2 --block 4 \
    > /tmp/o/gemma.log 2>&1; grep -E "vs alone" /tmp/o/gemma.log | tail -3
for d in /tmp/o/resnet50 /tmp/o/gemma; do [ -f $d/bench_compose.json ] || python3 scripts/bench_compose.py --out $d --pool-only; done
cd /tmp && tar czf $OUT/o.tgz o
