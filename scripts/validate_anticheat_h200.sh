#!/usr/bin/env bash
# Issue 18's GPU validation in one device command (about 8 minutes on an H200):
#   bash scripts/validate_anticheat_h200.sh "$OUT"
# 1. the timed-call and floor GPU tests; 2. the shipped adversarial suite (every class caught, every
# honest kernel accepted); 3. the builtin norm and elementwise/softmax/pooling tests (correct kernels
# still verify; the lines show eager beside/alone, rounds dropped for a short lead, and corrections);
# 4. the export sanitizer; 5. bench_lane (throughput and the 5-evaluation repeatability).
# Each step has its own time limit so one slow step cannot take the rest with it; summary.md collects
# the lines that matter.
set -u
OUT=${1:?usage: validate_anticheat_h200.sh OUT}
mkdir -p "$OUT"
step() {  # step NAME SECONDS CMD...
  local name=$1 secs=$2; shift 2
  local t0=$SECONDS
  timeout "$secs" "$@" > "$OUT/$name.log" 2>&1
  echo "## $name: exit $? in $((SECONDS - t0)) s" >> "$OUT/summary.md"
  grep -E "passed|failed|error|verified|rejected|CORRECTED|cheating|overrun|mutation|suspicious|Error" "$OUT/$name.log" \
    | grep -v "^tests/.*PASSED" | tail -60 >> "$OUT/summary.md"
}
: > "$OUT/summary.md"
step timed 120 python -m pytest -q -m gpu tests/test_timed_gpu.py tests/test_floor.py -p no:cacheprovider
step adversarial 240 python -m pytest -s -q -m gpu tests/test_lane_adversarial.py -p no:cacheprovider
step builtin 200 python -m pytest -s -q -m gpu tests/test_builtin_gpu_norms.py tests/test_builtin_gpu_a.py -p no:cacheprovider
step sanitize 90 python -m pytest -q -m gpu tests/test_export_sanitize.py -p no:cacheprovider
step bench_lane 150 python scripts/bench_lane.py --skip-models --out "$OUT/bench_lane"
cat "$OUT/bench_lane/"*.md >> "$OUT/summary.md" 2>/dev/null
