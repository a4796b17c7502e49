# 2026-12-05b: (1) the lane changes of the thirty-sixth session not yet run on a GPU: per-buffer canaries
# (1c97281), written arguments (3f436b0), the index-range edge set (a4dbe01), export ordering (73152d4) --
# tests/test_timed_gpu.py, the red team's audit predictor (a1.py), the adversarial suite in the lane;
# (2) the layout probe (scripts/probe_conv_layout.py) on the SD3.5 VAE and ResNet-50: eager with the model's
# convolutions channels-last, no cast (is an eager layout route worth building? issue 20's sd35_medium >= 2.2x).
source .devrun/setup.sh >/dev/null 2>&1
rm -rf /tmp/o; mkdir -p /tmp/o
export PYTHONPATH=$PYTHONPATH:$PWD/tests PYTHONUNBUFFERED=1
for c in configs/examples/sd35_vae.toml configs/models/resnet50.toml; do
  timeout 100 python3 scripts/probe_conv_layout.py --config $c --out /tmp/o/layout > /tmp/o/layout-$(basename $c).log 2>&1
  head -3 /tmp/o/layout-$(basename $c).log | cut -c1-250
done
timeout 150 python3 scripts/gpu_tests.py --out /tmp/o/gt-timed --timeout 140 tests/test_timed_gpu.py \
    > /tmp/o/gt-timed.log 2>&1; tail -3 /tmp/o/gt-timed.log
timeout 100 python3 docs/results/reproduce-h200/2026-12-05/a1.py 4194304 3 3 2>&1 | grep -v Warn > /tmp/o/a1.txt; cut -c1-300 /tmp/o/a1.txt | tail -5
timeout 200 python3 -m pytest -q -s tests/test_lane_adversarial.py -k lane_rejects > /tmp/o/adversarial.txt 2>&1
tail -48 /tmp/o/adversarial.txt | cut -c1-200
cd /tmp && tar czf $OUT/o.tgz o
