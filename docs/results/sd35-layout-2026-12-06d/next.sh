# Prepared 2026-12-06d (forty-ninth session) for the next device session: sd35_medium in eager with three things
# no GPU has run yet: (1) the convolutions' bias adds as cards (engine/capture/hidden.py: `aten::add_` of
# [1,C,1,1] into each convolution's output, which eager runs at half a copy's rate, 7.3 ms per forward);
# (2) the guard telling apart what PyTorch takes for channels-last (c6c4706), so that a layout route keeps the
# Decoder channels-last past its first upsampling; (3) the export leaving pattern cards out before confirming;
# (4) channels-last twins of the upsamplings (aacebdf), for the routed Decoder.
# The GPU tests of layout routes first, then run -> export (layout and graph routes tried) -> bench_e2e.
# Resumable on one warm machine (state in /tmp/o, /tmp/ws): call it again until e2e.done. LIMIT: seconds for this
# call (default 565); WALL: the run's wall time in all (default 420: about 40 cards).
# carry: .whl
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl  # the wheelhouse
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests KFORGE_PROGRESS=1 PYTHONUNBUFFERED=1
LIMIT=${LIMIT:-565}; WALL=${WALL:-420}
O=/tmp/o; W=/tmp/ws; CFG=configs/models/sd35_medium.toml; mkdir -p $O
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $O/gpu.txt 2>&1; cat $O/gpu.txt
echo ${COMMIT:-$(git rev-parse HEAD 2>/dev/null)} > $O/commit.txt
left() { echo $((LIMIT - SECONDS)); }
# The C++ router's build (about a minute, once per machine) while the run searches, not in the export's first
# confirmation (70 s of it there in the first sitting); waited for before the call ends (a build killed holding
# torch's lock file would leave the next one waiting)
if [ ! -e $O/router.done ]; then
  (python3 -c "from engine.cast import cpp_router as r; e = r.extension(); print('built' if e else r.why_not())" \
    > $O/router.log 2>&1 && touch $O/router.done) & RPID=$!
fi
pack() { [ -f $W/kforge.db ] && python3 scripts/run_table.py $W/kforge.db --out $O/run.md >/dev/null 2>&1
         [ -f $W/kforge.db ] && python3 -c "import sqlite3; s, d = sqlite3.connect('$W/kforge.db'), sqlite3.connect('$O/kforge.db'); s.backup(d)"
         echo "t=$SECONDS" >> $O/calls.txt; tar czf $OUT/o.tgz -C /tmp o; }
trap pack EXIT
stamp() { echo "$(date +%T) t=$SECONDS $*" | tee -a $O/calls.txt; }
# 0. the GPU tests of layout routes and of the bias-add cards, once
if [ ! -e $O/tests.done ]; then
  stamp "tests"; timeout 240 python3 scripts/gpu_tests.py --timeout 150 --out $O/tests \
    tests/test_layout_routes_gpu.py tests/test_capture_hidden_gpu.py > $O/tests.log 2>&1; stamp "tests rc=$?"; tail -4 $O/tests.log; touch $O/tests.done
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
    --ops 'module|aten::native_group_norm|aten::upsample|aten::add_' --no-compile-ref --iterations 8 >> $O/run.json 2>> $O/run.log; rc=$?
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
[ -n "$RPID" ] && wait $RPID; cat $O/router.log 2>/dev/null | tail -1
stamp end
