# 2026-12-06d, second sitting: the same run's export again after c6c4706 (the guard tells apart what PyTorch takes
# for channels-last), so that its layout trial runs the Decoder channels-last end to end; then the whole model.
# WS: a workspace holding the first sitting's kforge.db (sitting1/kforge.db.gz, gunzipped; its samples are not
# kept, so each variant is confirmed on inputs synthesised from its signature). LIMIT: seconds for this call.
# carry: .whl and the workspace folder
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests KFORGE_PROGRESS=1 PYTHONUNBUFFERED=1
LIMIT=${LIMIT:-500}; O=${OUT:-/tmp/out}/o; W=/tmp/ws; mkdir -p $O $W
[ -f $W/kforge.db ] || cp ${WS:?a workspace folder}/kforge.db $W/
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $O/gpu.txt 2>&1; cat $O/gpu.txt
echo ${COMMIT:-$(git rev-parse HEAD 2>/dev/null)} > $O/commit.txt
left() { echo $((LIMIT - SECONDS)); }
stamp() { echo "$(date +%T) t=$SECONDS $*" | tee -a $O/calls.txt; }
stamp "export limit=$(( $(left) - 150 ))"
timeout -s INT -k 20 $(( $(left) - 150 )) python3 -m kforge_tui export --workspace $W --out $O/sd35_medium.cast --json \
  --target eager > $O/export.json 2>> $O/export.log; stamp "export rc=$?"
grep -h "whole-model\|layout routes\|graph routes" $O/export.log | cut -c1-200
if [ -f $O/sd35_medium.cast ] && [ $(left) -gt 60 ]; then
  stamp "e2e"; timeout -s INT -k 10 $(( $(left) - 10 )) python3 scripts/bench_e2e.py --out $O/e2e --casts $O \
    --models sd35_medium > $O/e2e.log 2>&1; stamp "e2e rc=$?"; head -8 $O/e2e/bench_e2e.md 2>/dev/null | tail -3
fi
if [ -f $O/e2e/bench_e2e.md ] && [ $(left) -gt 100 ]; then
  stamp "e2e full depth"; timeout -s INT -k 10 $(( $(left) - 10 )) python3 scripts/bench_e2e.py --out $O/e2e --append \
    --casts $O --models sd35_medium@full_depth=true > $O/full.log 2>&1; stamp "full rc=$?"
fi
stamp end
