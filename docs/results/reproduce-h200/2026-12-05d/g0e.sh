# 2026-12-05d, second call: the contention blocks held until the candidate's stream releases them (g0d showed a
# fixed 30 us spin ended before the host launched the candidate). race_diag3.py, the adversarial suite, the timed
# tests. About 3 minutes.
source .devrun/setup.sh >/dev/null 2>&1
rm -rf /tmp/o; mkdir -p /tmp/o
export PYTHONPATH=$PYTHONPATH:$PWD/tests PYTHONUNBUFFERED=1
timeout 60 python3 docs/results/reproduce-h200/2026-12-05d/race_diag3.py > /tmp/o/race_diag3.txt 2>&1; grep -E "#[05]|Error|error" /tmp/o/race_diag3.txt | cut -c1-330
timeout 150 python3 -m pytest -q -s -n 0 tests/test_lane_adversarial.py -k lane_rejects > /tmp/o/adversarial.txt 2>&1
grep -E "^\[(7|12|5|2)\]" /tmp/o/adversarial.txt | cut -c1-200; grep -E "^E  +\[" /tmp/o/adversarial.txt | cut -c1-250; tail -1 /tmp/o/adversarial.txt
# (the timed tests ran in g0d at 5ed97c6: 6 of 6; this change touches only the busy-stream verification runs)
cd /tmp && tar czf $OUT/o.tgz o
