# 2026-12-05d, for the next session: is it the legacy default stream, the hardware queues, or neither that kept the
# contention blocks and the candidate apart? race_diag4.py prints which streams overlap which (driver streams and
# pool streams beside the default stream, driver streams beside each other), with CUDA_DEVICE_MAX_CONNECTIONS unset,
# 1 and 32, then race_diag3's timed cases (side stream: the worker's pick; once the first pool stream); then the
# adversarial suite. ~3 min.
source .devrun/setup.sh >/dev/null 2>&1
rm -rf /tmp/o; mkdir -p /tmp/o
export PYTHONPATH=$PYTHONPATH:$PWD/tests PYTHONUNBUFFERED=1
D=docs/results/reproduce-h200/2026-12-05d
timeout 60 python3 $D/race_diag4.py driver > /tmp/o/diag4-driver.txt 2>&1
CUDA_DEVICE_MAX_CONNECTIONS=1 timeout 60 python3 $D/race_diag4.py driver > /tmp/o/diag4-driver-1.txt 2>&1
CUDA_DEVICE_MAX_CONNECTIONS=32 timeout 60 python3 $D/race_diag4.py driver > /tmp/o/diag4-driver-32.txt 2>&1
timeout 60 python3 $D/race_diag4.py pool > /tmp/o/diag4-pool.txt 2>&1
for f in /tmp/o/diag4-*.txt; do echo "== $f"; grep -E "^side|^overlap|#2|Error|Traceback|kforge lane" $f | cut -c1-260; done
timeout 150 python3 -m pytest -q -s -n 0 tests/test_lane_adversarial.py -k lane_rejects > /tmp/o/adversarial.txt 2>&1
grep -E "^\[(7|12)\]" /tmp/o/adversarial.txt | cut -c1-200; grep -E "^E  +\[" /tmp/o/adversarial.txt | cut -c1-250; tail -1 /tmp/o/adversarial.txt
cd /tmp && tar czf $OUT/o.tgz o
