# 2026-12-04g: the VAE's largest GroupNorm -> SiLU chain and its channels-last twin in one lane (stream; the
# group_norm_cl kernels with SiLU, flat and tiled apply), then the VAE's eager forward with its convolutions
# channels-last (scripts/probe_conv_layout.py: is a layout route worth building for issue 20's sd35_medium
# >= 2.2x in eager?). About 4 minutes.
source .devrun/setup.sh >/dev/null 2>&1
rm -rf /tmp/o; mkdir -p /tmp/o
export PYTHONPATH=$PYTHONPATH:$PWD/tests
timeout 280 python3 scripts/gpu_tests.py --out /tmp/o/gt-chain --timeout 270 tests/test_builtin_chains_gpu.py \
    -k vae_shape > /tmp/o/gt-chain.log 2>&1; tail -3 /tmp/o/gt-chain.log
grep -hE "^(chain|twin) " /tmp/o/gt-chain/logs/*.log | cut -c1-230
timeout 240 python3 scripts/probe_conv_layout.py --config configs/examples/sd35_vae.toml --out /tmp/o/layout \
    > /tmp/o/layout.log 2>&1; head -4 /tmp/o/layout.log
cd /tmp && tar czf $OUT/o.tgz o
