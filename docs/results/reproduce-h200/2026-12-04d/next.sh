# For the next GPU session (written at the end of 2026-12-04d, not run). Setup as 2026-12-04c/next.sh: the
# wheelhouse in .whl/, setup.sh and pack.sh of 2026-12-04b in .devrun/. About 8 minutes. Outputs are tarred
# into $OUT/o.tgz: a device command brings back at most 8 files, and a `| head` on a benchmark's output kills
# it when the pipe closes (2026-12-04c/next2.sh lost its run that way).
source .devrun/setup.sh
rm -rf /tmp/o; mkdir -p /tmp/o
R=docs/results/reproduce-h200
# 1. ResNet-50 with its eager-only cast under torch.compile, now that cast.compile is torch.compile itself where
#    the cast has nothing for the mode: expected ~1.000 in both modes (one compile serves both arms)
timeout 280 python3 scripts/bench_compose.py --out /tmp/o/resnet50 --model configs/models/resnet50.toml \
    --cast $R/2026-12-03g/resnet50/resnet50.cast --modes default,reduce-overhead --max-s 5 --processes 3 \
    > /tmp/o/resnet50.log 2>&1; grep -E "verdict|vs alone|process" /tmp/o/resnet50.log | tail -8
# 2. Gemma 4 E2B (4 layers) with its eager-only cast (module cards and graph routes): the same, with patched modules
timeout $((540 - SECONDS)) python3 scripts/bench_compose.py --out /tmp/o/gemma --model configs/models/gemma4_e2b.toml \
    --cast $R/2026-12-04b/gemma4_e2b/gemma4_e2b.cast --modes default --max-s 6 --processes 3 \
    > /tmp/o/gemma.log 2>&1; grep -E "vs alone|process" /tmp/o/gemma.log | tail -6
for d in /tmp/o/resnet50 /tmp/o/gemma; do [ -f $d/bench_compose.json ] || python3 scripts/bench_compose.py --out $d --pool-only; done
cd /tmp && tar czf $OUT/o.tgz o
