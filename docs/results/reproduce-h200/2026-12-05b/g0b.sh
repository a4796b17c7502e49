# 2026-12-05b: the lane against cheats after the thirty-sixth session's changes (per-buffer canaries 1c97281,
# written arguments 3f436b0, the index-range edge set a4dbe01): the red team's audit predictor (a1.py, 3 runs)
# and the adversarial suite in the lane; tests/test_timed_gpu.py first. About 7 minutes.
source .devrun/setup.sh >/dev/null 2>&1
rm -rf /tmp/o; mkdir -p /tmp/o
export PYTHONPATH=$PYTHONPATH:$PWD/tests PYTHONUNBUFFERED=1
timeout 150 python3 scripts/gpu_tests.py --out /tmp/o/gt-timed --timeout 140 tests/test_timed_gpu.py \
    > /tmp/o/gt-timed.log 2>&1; tail -3 /tmp/o/gt-timed.log
timeout 100 python3 docs/results/reproduce-h200/2026-12-05/a1.py 4194304 3 3 2>&1 | grep -v Warn > /tmp/o/a1.txt; cut -c1-300 /tmp/o/a1.txt | tail -5
timeout 240 python3 -m pytest -q -s tests/test_lane_adversarial.py -k lane_rejects > /tmp/o/adversarial.txt 2>&1
tail -48 /tmp/o/adversarial.txt | cut -c1-200
cd /tmp && tar czf $OUT/o.tgz o
