# 2026-12-05d (thirty-ninth session): the class-7 race with timestamps (race_diag3.py: where do the contention
# blocks start relative to the candidate's?), the adversarial suite with the gated contention blocks, the timed
# tests, and the cast GPU tests that 2026-12-05c/g0c.sh's time limit cut (ResNet-50's CUDA-graph capture, the host
# cost probe, graph routes). About 6 minutes.
source .devrun/setup.sh >/dev/null 2>&1
rm -rf /tmp/o; mkdir -p /tmp/o
export PYTHONPATH=$PYTHONPATH:$PWD/tests PYTHONUNBUFFERED=1
git log --oneline -1 > /tmp/o/commit.txt 2>/dev/null
timeout 60 python3 docs/results/reproduce-h200/2026-12-05d/race_diag3.py > /tmp/o/race_diag3.txt 2>&1; tail -32 /tmp/o/race_diag3.txt | cut -c1-260
timeout 170 python3 -m pytest -q -s -n 0 tests/test_lane_adversarial.py -k lane_rejects > /tmp/o/adversarial.txt 2>&1
grep -E "^\[[0-9]+\]" /tmp/o/adversarial.txt | cut -c1-150; tail -2 /tmp/o/adversarial.txt | cut -c1-300
timeout 100 python3 scripts/gpu_tests.py --out /tmp/o/gt-timed --timeout 90 tests/test_timed_gpu.py > /tmp/o/gt-timed.log 2>&1; tail -2 /tmp/o/gt-timed.log
timeout 220 python3 scripts/gpu_tests.py --out /tmp/o/gt-cast --timeout 160 -k "cuda_graph_capture_and_replay[resnet50]" \
    tests/test_cast_gpu.py > /tmp/o/gt-cast.log 2>&1
timeout 90 python3 scripts/gpu_tests.py --out /tmp/o/gt-cast2 --timeout 40 tests/test_cast_graph_routes_gpu.py \
    > /tmp/o/gt-cast2.log 2>&1
timeout 40 python3 scripts/gpu_tests.py --out /tmp/o/gt-cast3 --timeout 35 -k host_cost tests/test_cast_gpu.py \
    > /tmp/o/gt-cast3.log 2>&1; tail -3 /tmp/o/gt-cast*.log
cd /tmp && tar czf $OUT/o.tgz o
