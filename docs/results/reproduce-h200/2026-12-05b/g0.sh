# 2026-12-05b: (1) the layout probe (scripts/probe_conv_layout.py) on the SD3.5 VAE and ResNet-50: eager with the
# model's convolutions channels-last, no cast; (2) tests/test_layout_routes_gpu.py: layout routes (d8b5087) on
# CUDA, and the export's layout check in its fresh process on the VAE's small build. About 4 minutes.
source .devrun/setup.sh >/dev/null 2>&1
rm -rf /tmp/o; mkdir -p /tmp/o
export PYTHONPATH=$PYTHONPATH:$PWD/tests PYTHONUNBUFFERED=1
for c in configs/examples/sd35_vae.toml configs/models/resnet50.toml; do
  timeout 100 python3 scripts/probe_conv_layout.py --config $c --out /tmp/o/layout > /tmp/o/layout-$(basename $c).log 2>&1
  head -3 /tmp/o/layout-$(basename $c).log | cut -c1-250
done
timeout 200 python3 scripts/gpu_tests.py --out /tmp/o/gt-layout --timeout 190 tests/test_layout_routes_gpu.py \
    > /tmp/o/gt-layout.log 2>&1; tail -3 /tmp/o/gt-layout.log
grep -h "layout-" /tmp/o/gt-layout/logs/*.log | cut -c1-250
cd /tmp && tar czf $OUT/o.tgz o
