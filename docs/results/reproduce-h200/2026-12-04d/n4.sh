source .devrun/setup.sh >/dev/null 2>&1
rm -rf /tmp/o; mkdir -p /tmp/o
timeout 300 python3 scripts/bench_compose.py --out /tmp/o/resnet50-control-w3 --model configs/models/resnet50.toml \
    --cast docs/results/reproduce-h200/2026-12-03g/resnet50/resnet50.cast --modes default,reduce-overhead --max-s 5 --control --warm-calls 3 > /tmp/o/control.log 2>&1
grep -E "control arms|torch.compile (default|reduce)" /tmp/o/control.log | tail -8
cd /tmp && tar czf $OUT/o.tgz o
