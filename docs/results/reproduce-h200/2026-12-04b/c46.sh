# Gemma under torch.compile (default) with the control arms, the sitting's eager-target cast
source .devrun/setup.sh >/dev/null; rm -rf /tmp/o; mkdir -p /tmp/o
timeout 185 python3 scripts/bench_compose.py --out /tmp/o/ctl --model configs/models/gemma4_e2b.toml --cast docs/results/reproduce-h200/2026-12-04b/gemma4_e2b/gemma4_e2b.cast --modes default --control --max-s 8 2>&1 | tail -4
bash .devrun/pack.sh
