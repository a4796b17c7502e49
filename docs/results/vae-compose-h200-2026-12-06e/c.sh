# 2026-12-06e (fiftieth session): issue 19's figure on an H200 without a new run: the cast the pipeline exported on
# the H100 (../vae-compose-2026-12-06b/sd35_vae.cast, --target compile, 27 variants) measured on this card,
# torch.compile alone against torch.compile + the cast, whole decodes, three processes (`--processes 3`:
# which arm compiles first alternates). Only on an H200 (gpu.txt); elsewhere it does nothing. Results in $OUT/vae/.
# Then the sd35 script of the forty-ninth session with what is left of the call (SD35=0: not). PROCS: processes
# of the comparison (default 3); TMO: its time limit in seconds (default 430). carry: .whl
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests PYTHONUNBUFFERED=1
V=$OUT/vae; mkdir -p $V; CAST=docs/results/vae-compose-2026-12-06b/sd35_vae.cast; CFG=configs/examples/sd35_vae.toml
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,clocks.max.sm --format=csv > $V/gpu.txt 2>&1; cat $V/gpu.txt
git rev-parse HEAD > $V/commit.txt 2>/dev/null
if grep -q H200 $V/gpu.txt && [ ! -e /tmp/vae.done ]; then
  P=${PROCS:-3}; echo "$(date +%T) t=$SECONDS compose --processes $P" >> $V/calls.txt
  timeout -s INT -k 15 ${TMO:-430} python3 scripts/bench_compose.py --out $V/compose --model $CFG --cast $CAST \
    --modes default --max-s 20 --processes $P > $V/compose.log 2>&1; echo "$(date +%T) t=$SECONDS rc=$?" >> $V/calls.txt
  [ -f $V/compose/bench_compose.json ] || python3 scripts/bench_compose.py --pool-only --out $V/compose >> $V/compose.log 2>&1
  tail -12 $V/compose/bench_compose.md 2>/dev/null
  touch /tmp/vae.done
fi
L=$(( ${LIMIT:-565} - SECONDS )); [ "${SD35:-1}" = 1 ] && [ $L -gt 150 ] && LIMIT=$L bash docs/results/sd35-layout-2026-12-06d/next.sh
