# 2026-12-05d, for the next session: is it the legacy default stream or the hardware queues that kept the
# contention blocks and the candidate apart? race_diag4.py with the side stream from torch's pool and from the
# driver (non-blocking), each with CUDA_DEVICE_MAX_CONNECTIONS unset and 32; then the adversarial suite. ~3 min.
source .devrun/setup.sh >/dev/null 2>&1
rm -rf /tmp/o; mkdir -p /tmp/o
export PYTHONPATH=$PYTHONPATH:$PWD/tests PYTHONUNBUFFERED=1
D=docs/results/reproduce-h200/2026-12-05d
for side in pool driver; do
  timeout 60 python3 $D/race_diag4.py $side > /tmp/o/diag4-$side.txt 2>&1
  CUDA_DEVICE_MAX_CONNECTIONS=32 timeout 60 python3 $D/race_diag4.py $side > /tmp/o/diag4-$side-32.txt 2>&1
done
grep -hE "^side|#0|Error" /tmp/o/diag4-*.txt | cut -c1-300
timeout 150 python3 -m pytest -q -s -n 0 tests/test_lane_adversarial.py -k lane_rejects > /tmp/o/adversarial.txt 2>&1
grep -E "^\[(7|12)\]" /tmp/o/adversarial.txt | cut -c1-200; grep -E "^E  +\[" /tmp/o/adversarial.txt | cut -c1-250; tail -1 /tmp/o/adversarial.txt
cd /tmp && tar czf $OUT/o.tgz o
