# Prepared 2026-12-06e (fiftieth session) for the next device session: what is worth measuring with the casts already
# exported, most valuable first, on whatever card comes. Resumable on one warm machine: call it again until it
# prints "all done" (state and each step's files in /tmp/go/STEP, packed in $OUT/go.tgz at the end of each call).
# LIMIT: seconds for this call (default 565). carry: .whl
#   h200-e2e   (H200 only) sd35_medium in eager with ../sd35-bias-2026-12-06e/sd35_medium.cast (bench_e2e):
#              issue 20's >= 2.2x on the card it names (2.595x on the H100)
#   h200-vae   (H200 only) the VAE under torch.compile with ../vae-compose-2026-12-06b/sd35_vae.cast against
#              torch.compile alone, two processes: issue 19's >= 1.3x on the H200 (1.309x on the H100)
#   tests      (added in the fifty-first session, never run on a GPU) the unseen-family captures on CUDA (nms-like
#              ops, FFT, a view shared by two computations, calls that write nothing) and casts edited into
#              nonsense for one variant (both routers): tests/test_capture_unseen_families.py, test_cast_tamper_gpu.py
#   compose    sd35_medium: eager, eager + the cast, torch.compile alone, in one process on one card (bench_compose):
#              the README compares the cast's 2.595x (H100) with torch.compile's 2.37x (H200)
#   where      the kernels of sd35's forward, eager and with the cast's op and layout routes (where the 39 ms go)
#   wc         the compiled VAE decode's kernels by kind, alone and with its cast (what bounds issue 20's 1.6x)
#   sweep      group_norm_cl's order "chunks" against "sweep" (d5823cf, not yet timed) on the VAE's largest
#              GroupNorm's channels-last twin, tile and flat apply (scripts/probe_template_params.py --twin)
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests PYTHONUNBUFFERED=1
LIMIT=${LIMIT:-565}; S=/tmp/go; mkdir -p $S
SD=docs/results/sd35-bias-2026-12-06e; VAE=docs/results/vae-compose-2026-12-06b/sd35_vae.cast
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,clocks.max.sm --format=csv > $S/gpu.txt 2>&1; cat $S/gpu.txt
grep -q H200 $S/gpu.txt && H200=1 || H200=0
trap 'tar czf $OUT/go.tgz -C /tmp go' EXIT
stamp() { echo "$(date +%T) t=$SECONDS $*" | tee -a $S/calls.txt; }
# step NAME NEEDS_S H200_ONLY CMD...: run CMD (its files under $S/NAME) if not done and NEEDS_S seconds are left
step() {
  local name=$1 need=$2 h200=$3; shift 3
  [ -e $S/$name.done ] && return 0
  [ "$h200" = 1 ] && [ $H200 = 0 ] && return 0
  local left=$((LIMIT - SECONDS)); [ $left -ge $need ] || { stamp "$name: $left s left, needs $need"; return 0; }
  stamp "$name"; mkdir -p $S/$name
  timeout -s INT -k 15 $((left - 20)) "$@" > $S/$name/log.txt 2>&1; local rc=$?; stamp "$name rc=$rc"
  [ $rc = 0 ] && touch $S/$name.done; tail -8 $S/$name/log.txt | cut -c1-300
}
step h200-e2e 150 1 python3 scripts/bench_e2e.py --out $S/h200-e2e --casts $SD --models sd35_medium
step h200-vae 300 1 python3 scripts/bench_compose.py --out $S/h200-vae --model configs/examples/sd35_vae.toml \
  --cast $VAE --modes default --max-s 20 --processes 2
step tests 180 0 python3 scripts/gpu_tests.py --out $S/tests --timeout 120 tests/test_capture_unseen_families.py \
  tests/test_cast_tamper_gpu.py
step compose 300 0 python3 scripts/bench_compose.py --out $S/compose --model configs/models/sd35_medium.toml --cast $SD/sd35_medium.cast \
  --modes default --max-s 20
step where 150 0 python3 $SD/where.py $SD/sd35_medium.cast $S/where
step wc 240 0 python3 docs/results/vae-compose-h200-2026-12-06e/where_compiled.py $VAE $S/wc
step sweep 150 0 python3 scripts/probe_template_params.py --out $S/sweep --case "VAE, largest" --twin \
  --sweep order=chunks,sweep apply=tile,flat --timing-s 2
left=0; for n in h200-e2e h200-vae tests compose where wc sweep; do
  [ -e $S/$n.done ] || { [ $H200 = 0 ] && [ "${n#h200}" != "$n" ]; } || left=1; done
[ $left = 0 ] && stamp "all done"
