#!/usr/bin/env bash
# One model config through the user's path on a GPU, everything written under OUT:
#   run (capture, builtin proposer, default budget unless flags say otherwise) → export → audit,
#   plus a consistent copy of the workspace store (kforge.db).
#
#   bash scripts/run_model.sh resnet50 OUT [run flags, e.g. --wall-time 300]
#
# The workspace is $KFORGE_HOME, else /tmp/kforge-ws-MODEL. Steps and exit codes go to OUT/steps.txt.
set -u
model=$1; out=$2; shift 2
ws=${KFORGE_HOME:-/tmp/kforge-ws-$model}
cfg=configs/models/$model.toml
mkdir -p "$out"
t0=$(date +%s)
python3 -m kforge_tui run "$cfg" --no-tui --json --workspace "$ws" "$@" > "$out/run.json" 2> "$out/run.log"
echo "run rc=$? in $(( $(date +%s) - t0 )) s" | tee -a "$out/steps.txt"
t1=$(date +%s)
python3 -m kforge_tui export --workspace "$ws" --out "$out/$model.cast" > "$out/export.txt" 2>&1
echo "export rc=$? in $(( $(date +%s) - t1 )) s" | tee -a "$out/steps.txt"
if [ -f "$out/$model.cast" ]; then
  python3 -m kforge_tui audit "$out/$model.cast" > "$out/audit.txt" 2>&1
  python3 -m kforge_tui audit "$out/$model.cast" --json > "$out/audit.json" 2>> "$out/audit.txt"
  echo "audit rc=$?" | tee -a "$out/steps.txt"
fi
python3 - "$ws/kforge.db" "$out/kforge.db" <<'PY'
import sqlite3, sys
src, dst = sqlite3.connect(sys.argv[1]), sqlite3.connect(sys.argv[2])
src.backup(dst)
dst.close()
PY
du -sh "$ws" | tee -a "$out/steps.txt"
