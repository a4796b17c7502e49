# 2026-12-06c (forty-eighth session): sd35_medium in eager with layout routes that keep GroupNorm channels-last
# (engine/cast/layouts.py `_KeepLayout`). The first sitting's export tried the Decoder channels-last at 0.639x:
# every GroupNorm copied its input back to NCHW (probe.py, this folder). Resumable: run it again on the same warm
# machine (state in /tmp/o, /tmp/ws) until e2e.done. LIMIT: seconds for this call (default 565). WALL: the run's
# wall time in all (default 330). First the new GPU test (layout routes keep GroupNorm channels-last on CUDA).
# Steps: run --ops 'module|aten::native_group_norm|aten::upsample' --no-compile-ref --iterations 8 (the module cards, every
# GroupNorm card and its channels-last twin, the upsamplings; not the GroupNorm -> SiLU pattern cards, which serve only
# under torch.compile: their member ops are named without 'aten::') -> export --target eager (graph and layout routes
# tried) -> bench_e2e. COMMIT: the commit checked out (the device's copy has no git history of this session).
# carry: .whl
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl  # the wheelhouse
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests KFORGE_PROGRESS=1 PYTHONUNBUFFERED=1
LIMIT=${LIMIT:-565}; WALL=${WALL:-330}
O=/tmp/o; W=/tmp/ws; CFG=configs/models/sd35_medium.toml; mkdir -p $O
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $O/gpu.txt 2>&1; cat $O/gpu.txt
echo ${COMMIT:-$(git rev-parse HEAD 2>/dev/null)} > $O/commit.txt
left() { echo $((LIMIT - SECONDS)); }
pack() { [ -f $W/kforge.db ] && python3 scripts/run_table.py $W/kforge.db --out $O/run.md >/dev/null 2>&1
         [ -f $W/kforge.db ] && python3 -c "import sqlite3; s, d = sqlite3.connect('$W/kforge.db'), sqlite3.connect('$O/kforge.db'); s.backup(d)"
         echo "t=$SECONDS" >> $O/calls.txt; tar czf $OUT/o.tgz -C /tmp o; }
trap pack EXIT
stamp() { echo "$(date +%T) t=$SECONDS $*" | tee -a $O/calls.txt; }
# 0. the new GPU test, once
if [ ! -e $O/tests.done ]; then
  stamp "tests"; timeout 120 python3 scripts/gpu_tests.py --timeout 100 --out $O/tests -k group_norm \
    tests/test_layout_routes_gpu.py > $O/tests.log 2>&1; stamp "tests rc=$?"; tail -4 $O/tests.log; touch $O/tests.done
fi
# 1. the run (builtin proposer), resumed where a call stopped it with what is left of its wall time
if [ ! -e $O/run.done ]; then
  spent=$(cat $O/run_spent 2>/dev/null || echo 0); wall=$((WALL - spent)); [ $wall -ge 120 ] || wall=120
  id=$(python3 -c "
from pathlib import Path; from engine.store import open_readonly, read
p = Path('$W/kforge.db')
if p.exists():
    c = open_readonly(p); r = read.latest_run(c); print(r['id'] if r else '')" 2>/dev/null)
  if [ -n "$id" ]; then what="--resume $id"; else what=$CFG; fi
  l=$(( $(left) - 40 )); stamp "run $what wall=$wall limit=$l"; t0=$SECONDS
  timeout -s INT -k 30 $l python3 -m kforge_tui run --no-tui --json --workspace $W $what --wall-time $wall \
    --ops 'module|aten::native_group_norm|aten::upsample' --no-compile-ref --iterations 8 >> $O/run.json 2>> $O/run.log; rc=$?
  echo $((spent + SECONDS - t0)) > $O/run_spent; stamp "run rc=$rc"
  [ $rc = 0 ] && touch $O/run.done
fi
# 2. export for eager (graph routes and layout routes tried); stopped part way, it resumes from its checkpoints
if [ -e $O/run.done ] && [ ! -e $O/export.done ] && [ $(left) -gt 150 ]; then
  l=$(( $(left) - 40 )); stamp "export limit=$l"
  timeout -s INT -k 30 $l python3 -m kforge_tui export --workspace $W --out $O/sd35_medium.cast --json \
    --target eager > $O/export.json 2>> $O/export.log; rc=$?; stamp "export rc=$rc"
  [ $rc = 0 ] && touch $O/export.done
fi
# 3. whole forwards, eager and under CUDA graphs, with and without the cast
if [ -e $O/export.done ] && [ -f $O/sd35_medium.cast ] && [ ! -e $O/e2e.done ] && [ $(left) -gt 160 ]; then
  l=$(( $(left) - 20 )); stamp "e2e limit=$l"
  timeout -s INT -k 15 $l python3 scripts/bench_e2e.py --out $O/e2e --casts $O --models sd35_medium \
    > $O/e2e.log 2>&1; rc=$?; stamp "e2e rc=$rc"
  [ $rc = 0 ] && touch $O/e2e.done; tail -12 $O/e2e/bench_e2e.md 2>/dev/null
fi
# 4. the same cast on the real depth (24 MMDiT blocks): a row beside the shrunk one
if [ -e $O/e2e.done ] && [ ! -e $O/full.done ] && [ $(left) -gt 200 ]; then
  l=$(( $(left) - 20 )); stamp "e2e full depth limit=$l"
  timeout -s INT -k 15 $l python3 scripts/bench_e2e.py --out $O/e2e --append --casts $O \
    --models sd35_medium@full_depth=true > $O/full.log 2>&1; rc=$?; stamp "full rc=$rc"
  [ $rc = 0 ] && touch $O/full.done; tail -6 $O/e2e/bench_e2e.md 2>/dev/null
fi
stamp end
