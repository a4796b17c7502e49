# 2026-12-06 (forty-sixth session): the SD3.5 VAE under torch.compile with its GroupNorm cast (issue 19's 1.3x),
# then the chains GPU test the last session did not reach. Resumable: run it again on the same warm machine
# (state in /tmp/o and /tmp/ws) until compose.done. LIMIT: seconds for this call (default 565). WALL: the run's
# wall time in all, capture and eager timing included (default 360). TESTS: GPU test files to run first.
# SKIP_CHAINS=1: no chains test. The workspace's database is copied to /tmp/o (the lane's messages). carry: .whl
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl  # the wheelhouse
export PYTHONPATH=/tmp/site:$PWD KFORGE_PROGRESS=1
LIMIT=${LIMIT:-565}; WALL=${WALL:-360}; export PYTHONUNBUFFERED=1 PYTHONPATH=$PYTHONPATH:$PWD/tests
O=/tmp/o; W=/tmp/ws; CFG=configs/examples/sd35_vae.toml; mkdir -p $O
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $O/gpu.txt 2>&1; cat $O/gpu.txt
git rev-parse HEAD > $O/commit.txt 2>/dev/null || true
left() { echo $((LIMIT - SECONDS)); }
pack() { [ -f $W/kforge.db ] && python3 scripts/run_table.py $W/kforge.db --out $O/run.md >/dev/null 2>&1
         [ -f $W/kforge.db ] && python3 -c "import sqlite3; s, d = sqlite3.connect('$W/kforge.db'), sqlite3.connect('$O/kforge.db'); s.backup(d)"
         echo "t=$SECONDS" >> $O/calls.txt; tar czf $OUT/o.tgz -C /tmp --exclude='o/*/samples' o; }
trap pack EXIT
stamp() { echo "$(date +%T) t=$SECONDS $*" | tee -a $O/calls.txt; }
# 0. GPU test files named in TESTS (space-separated), once, before the rest
if [ -n "$TESTS" ] && [ ! -e $O/tests.done ]; then
  stamp "tests $TESTS"; timeout $(( $(left) - 30 )) python3 scripts/gpu_tests.py --timeout 300 --out $O/tests $TESTS \
    > $O/tests.log 2>&1; touch $O/tests.done; tail -n +5 $O/tests/gpu_tests.md 2>/dev/null | cut -c1-300
fi
# 1. the run (builtin proposer, GroupNorm cards, twins and chains with them), resumed where a call stopped it
if [ ! -e $O/run.done ]; then
  spent=$(cat $O/run_spent 2>/dev/null || echo 0); wall=$((WALL - spent)); [ $wall -ge 120 ] || wall=120
  id=$(python3 -c "
import sys; from pathlib import Path; from engine.store import open_readonly, read
p = Path('$W/kforge.db')
if p.exists():
    c = open_readonly(p); r = read.latest_run(c); print(r['id'] if r else '')" 2>/dev/null)
  if [ -n "$id" ]; then what="--resume $id"; else what=$CFG; fi
  l=$(( $(left) - 40 )); stamp "run $what wall=$wall limit=$l"
  t0=$SECONDS
  timeout -s INT -k 30 $l python3 -m kforge_tui run --no-tui --json --workspace $W $what --wall-time $wall \
    --ops group_norm >> $O/run.json 2>> $O/run.log; rc=$?
  echo $((spent + SECONDS - t0)) > $O/run_spent; stamp "run rc=$rc"
  [ $rc = 0 ] && touch $O/run.done
fi
# 2. export for torch.compile (default mode) only; an export stopped part way resumes from its checkpoints
if [ -e $O/run.done ] && [ ! -e $O/export.done ] && [ $(left) -gt 150 ]; then
  l=$(( $(left) - 40 )); stamp "export limit=$l"
  timeout -s INT -k 30 $l python3 -m kforge_tui export --workspace $W --out $O/sd35_vae.cast --json \
    --target compile --no-graph-routes > $O/export.json 2>> $O/export.log; rc=$?; stamp "export rc=$rc"
  [ $rc = 0 ] && touch $O/export.done
fi
# 3. whole decodes: torch.compile alone against torch.compile + the cast (bench_compose), default mode
if [ -e $O/export.done ] && [ -f $O/sd35_vae.cast ] && [ ! -e $O/compose.done ] && [ $(left) -gt 200 ]; then
  l=$(( $(left) - 20 )); stamp "compose limit=$l"
  timeout -s INT -k 15 $l python3 scripts/bench_compose.py --out $O/compose --model $CFG --cast $O/sd35_vae.cast \
    --modes default --max-s 20 > $O/compose.log 2>&1; rc=$?; stamp "compose rc=$rc"
  [ $rc = 0 ] && touch $O/compose.done; tail -20 $O/compose/bench_compose.md 2>/dev/null
fi
# 4. the chains GPU test (module route in eager, the pattern op under cast.compile)
if [ ! -e $O/chains.done ] && [ -z "$SKIP_CHAINS" ] && [ $(left) -gt 260 ]; then
  stamp chains; timeout 250 python3 scripts/gpu_tests.py --timeout 240 --out $O/chains tests/test_run_chains_gpu.py \
    > $O/chains.log 2>&1; touch $O/chains.done; tail -n +5 $O/chains/gpu_tests.md 2>/dev/null | cut -c1-300
fi
# 5. a second process of the same comparison (the spread between compiles), then reduce-overhead
if [ -e $O/compose.done ] && [ ! -e $O/compose2.done ] && [ $(left) -gt 200 ]; then
  l=$(( $(left) - 20 )); stamp "compose2 limit=$l"
  timeout -s INT -k 15 $l python3 scripts/bench_compose.py --out $O/compose2 --model $CFG --cast $O/sd35_vae.cast \
    --modes default --max-s 20 --cast-first odd > $O/compose2.log 2>&1; rc=$?; stamp "compose2 rc=$rc"
  [ $rc = 0 ] && touch $O/compose2.done; tail -8 $O/compose2/bench_compose.md 2>/dev/null
fi
stamp end
