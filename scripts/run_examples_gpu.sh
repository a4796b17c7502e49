#!/usr/bin/env bash
# The example configs of other model families (configs/examples/, docs/examples.md) through the user's
# path on one GPU: `run` (capture at full size, builtin proposer, WALL_S seconds for the whole run), then
# `export` (fresh-process confirmation + whole-model check) and `audit` of the cast. Results go under OUT:
#   OUT/steps.txt                 one line per step: NAME STEP rc=N in S s
#   OUT/NAME/run.json, run.log    the run's JSON document and its progress lines
#   OUT/NAME/NAME.cast, export.json, export.log, audit.txt
#   OUT/NAME/kforge.db            a consistent copy of the workspace store
#
#   bash scripts/run_examples_gpu.sh OUT [WALL_S] [NAME ...]
#
# WALL_S defaults to 150: a run's wall time holds its capture, eager timing and reference timings (ConvNeXt's
# took 80 s on an H200) before any search; at 45 s three of four examples searched nothing. Each example takes
# about 3-4 minutes (run, then an export of about 30 s), so two fit one 10-minute call. NAME picks examples (default: vit_b16 convnext_tiny whisper_encoder deeplabv3); calls with
# other names may share one OUT. Workspaces (samples, gigabytes) stay out of OUT, in $KFORGE_EXAMPLES_WS
# (default /tmp/kforge-examples)/NAME, fresh each time. Each step has a time limit, and no step runs past
# $KFORGE_EXAMPLES_DEADLINE_S (default 540) seconds from the start: a step that would is cut short or
# skipped (rc=124 or "skipped" in steps.txt), so the script ends inside a 10-minute allowance.
set -u
out=${1:?usage: run_examples_gpu.sh OUT [WALL_S] [NAME ...]}
wall=${2:-150}
shift; [ $# -gt 0 ] && shift
names=${*:-vit_b16 convnext_tiny whisper_encoder deeplabv3}
ws_root=${KFORGE_EXAMPLES_WS:-/tmp/kforge-examples}
mkdir -p "$out" && out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."  # the configs' paths are relative to the repository root

start=$(date +%s)
exec 3>&1  # steps report here, past the redirections of each step's own output
deadline=${KFORGE_EXAMPLES_DEADLINE_S:-540}

step() {  # step NAME STEP LIMIT_S CMD...: run CMD under a time limit, append its exit code to steps.txt
  local name=$1 what=$2 limit=$3; shift 3
  local t0; t0=$(date +%s)
  local left=$(( deadline - (t0 - start) ))
  if [ "$left" -lt 20 ]; then
    echo "$name $what skipped: ${deadline} s of the script spent" | tee -a "$out/steps.txt" >&3
    return 125
  fi
  [ "$left" -lt "$limit" ] && limit=$left
  timeout --signal=INT --kill-after=30 "$limit" "$@"
  local rc=$?
  echo "$name $what rc=$rc in $(( $(date +%s) - t0 )) s" | tee -a "$out/steps.txt" >&3
  return $rc
}

for name in $names; do
  cfg=configs/examples/$name.toml
  ws=$ws_root/$name
  dir=$out/$name
  rm -rf "$ws"; mkdir -p "$dir"
  step "$name" run $(( wall + 120 )) python3 -m kforge_tui run "$cfg" --no-tui --json --workspace "$ws" \
    --wall-time "$wall" > "$dir/run.json" 2> "$dir/run.log"
  step "$name" export 240 python3 -m kforge_tui export --workspace "$ws" --out "$dir/$name.cast" --json \
    > "$dir/export.json" 2> "$dir/export.log"
  if [ -f "$dir/$name.cast" ]; then
    step "$name" audit 60 python3 -m kforge_tui audit "$dir/$name.cast" > "$dir/audit.txt" 2>&1
  fi
  if [ -f "$ws/kforge.db" ]; then
    python3 - "$ws/kforge.db" "$dir/kforge.db" <<'PY'
import sqlite3, sys
src, dst = sqlite3.connect(sys.argv[1]), sqlite3.connect(sys.argv[2])
src.backup(dst)
dst.close()
PY
  fi
done

# One line per example in OUT (this call's and earlier calls'): the run's outcome and the whole-model check, for a quick read.
python3 - "$out" <<'PY' | tee "$out/summary.txt"
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
for name in sorted(d.name for d in out.iterdir() if (d / "run.json").is_file()):
    def doc(file):
        try:
            return json.loads((out / name / file).read_text())
        except (OSError, ValueError):
            return {}
    run, exp = doc("run.json"), doc("export.json")
    cards = run.get("cards") or []
    verified = sum(1 for c in cards if c.get("verified"))
    mc = exp.get("model_check") or {}
    if mc:
        check = f"whole model {mc.get('speedup', float('nan')):.3f}x CI {mc.get('speedup_ci')} rel_l2 {mc.get('rel_l2_err')}"
    else:  # no cast: the export's own one-line reason (slower with the cast, nothing verified, ...)
        try:
            errors = [ln for ln in (out / name / "export.log").read_text().splitlines() if ln.startswith("error:")]
        except OSError:
            errors = []
        check = "no model check" + (f" ({errors[-1][len('error: '):]})" if errors else "")
    print(f"{name}: run {run.get('status')} ({run.get('stopped_by')}), {len(cards)} cards, "
          f"{run.get('evaluations')} evaluations, {verified} cards with a verified kernel; "
          f"cast {len(exp.get('included') or [])} variants, {len(exp.get('excluded') or [])} left on PyTorch; "
          f"{check}")
PY
