# 2026-12-05: the lane's protocol changes of the thirty-sixth session on the GPU (all CPU-tested only):
# - timed calls: eager on values of its own, audits' reference after the candidate's call, stale prefills;
# - verification: the stale-output run, workspaces poisoned, outputs scrubbed, structured integer inputs;
# - the adversarial suite with its class-1 kernel now expected `cheating` and class 11 (unzeroed workspace).
# About 8 minutes. Run it before any timing sitting: every number after it is timed by this protocol.
source .devrun/setup.sh >/dev/null 2>&1
rm -rf /tmp/o; mkdir -p /tmp/o
export PYTHONPATH=$PYTHONPATH:$PWD/tests
timeout 280 python3 scripts/gpu_tests.py --out /tmp/o/gt-timed --timeout 250 tests/test_timed_gpu.py \
    > /tmp/o/gt-timed.log 2>&1; tail -3 /tmp/o/gt-timed.log
timeout 260 python3 -m pytest -q -s tests/test_lane_adversarial.py -k lane_rejects > /tmp/o/adversarial.txt 2>&1
tail -40 /tmp/o/adversarial.txt
cd /tmp && tar czf $OUT/o.tgz o
