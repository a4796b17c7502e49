# 2026-12-05: the lane's protocol changes of the thirty-sixth session on the GPU:
# - tests/test_timed_gpu.py (timed calls: eager's own values, audits after the call, stale prefills, the
#   attacker that copies eager's answer when it finds one);
# - the red team's audit predictor (a1.py here: cheats while its output address repeats; 1.47-1.49x and never
#   caught before 9f15677), 3 runs on the add card: it must be caught or gain nothing;
# - the adversarial suite in the lane (class 1 now `cheating`, class 11 new).
source .devrun/setup.sh >/dev/null 2>&1
rm -rf /tmp/o; mkdir -p /tmp/o
export PYTHONPATH=$PYTHONPATH:$PWD/tests PYTHONUNBUFFERED=1
timeout 150 python3 scripts/gpu_tests.py --out /tmp/o/gt-timed --timeout 140 tests/test_timed_gpu.py \
    > /tmp/o/gt-timed.log 2>&1; tail -3 /tmp/o/gt-timed.log
timeout 120 python3 docs/results/reproduce-h200/2026-12-05/a1.py 4194304 3 3 2>&1 | grep -v Warn > /tmp/o/a1.txt; cat /tmp/o/a1.txt | cut -c1-300
timeout 240 python3 -m pytest -q -s tests/test_lane_adversarial.py -k lane_rejects > /tmp/o/adversarial.txt 2>&1
tail -45 /tmp/o/adversarial.txt | cut -c1-220
cd /tmp && tar czf $OUT/o.tgz o
