# ResNet-50 control with steady-state timing, at the new HEAD; the router build kept for the next machine
export TORCH_EXTENSIONS_DIR=/tmp/ext
[ -d .devrun/ext ] && cp -r .devrun/ext /tmp/ext
source .devrun/setup.sh
rm -rf /tmp/o/*; mkdir -p /tmp/o
export KFORGE_CAST_DIR=/tmp/casts
timeout 330 python3 scripts/bench_compose.py --out /tmp/o/rc40 --model configs/models/resnet50.toml --cast docs/results/reproduce-h200/2026-12-03g/resnet50/resnet50.cast --modes default,reduce-overhead --control --max-s 20 2>&1 | tail -16
echo "elapsed $SECONDS"
tar czf $OUT/ext.tgz -C /tmp/ext . 2>/dev/null
bash .devrun/pack.sh
