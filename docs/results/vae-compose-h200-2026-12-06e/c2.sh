# 2026-12-06e: on an H200 only (elsewhere it stops at once), with little device time: the casts exported on the
# H100 measured on this card. (1) sd35_medium in eager with ../sd35-bias-2026-12-06e/sd35_medium.cast
# (scripts/bench_e2e.py, eager and CUDA-graph arms); (2) the SD3.5 VAE under torch.compile with
# ../vae-compose-2026-12-06b/sd35_vae.cast against torch.compile alone (bench_compose, PROCS processes, default 2,
# within TMO seconds, default 300). Results in $OUT/h200/. carry: .whl
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests PYTHONUNBUFFERED=1
H=$OUT/h200; mkdir -p $H
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,clocks.max.sm --format=csv > $H/gpu.txt 2>&1; cat $H/gpu.txt
grep -q H200 $H/gpu.txt || exit 0
stamp() { echo "$(date +%T) t=$SECONDS $*" | tee -a $H/calls.txt; }
stamp e2e; timeout -s INT -k 10 150 python3 scripts/bench_e2e.py --out $H/e2e --casts docs/results/sd35-bias-2026-12-06e \
  --models sd35_medium > $H/e2e.log 2>&1; stamp "e2e rc=$?"; sed -n 5,7p $H/e2e/bench_e2e.md
P=${PROCS:-2}; stamp "compose --processes $P"
timeout -s INT -k 15 ${TMO:-300} python3 scripts/bench_compose.py --out $H/compose --model configs/examples/sd35_vae.toml \
  --cast docs/results/vae-compose-2026-12-06b/sd35_vae.cast --modes default --max-s 20 --processes $P \
  > $H/compose.log 2>&1; stamp "compose rc=$?"
[ -f $H/compose/bench_compose.json ] || python3 scripts/bench_compose.py --pool-only --out $H/compose >> $H/compose.log 2>&1
tail -12 $H/compose/bench_compose.md 2>/dev/null
