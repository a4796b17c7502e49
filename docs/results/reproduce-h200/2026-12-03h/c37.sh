source .devrun/setup.sh
export KFORGE_CAST_DIR=/tmp/casts
timeout 170 python3 scripts/bench_compose.py --out /tmp/o/rc37 --model configs/models/resnet50.toml --cast docs/results/reproduce-h200/2026-12-03g/resnet50/resnet50.cast --modes reduce-overhead --control 2>&1 | tail -14
echo "elapsed $SECONDS"
bash .devrun/pack.sh
