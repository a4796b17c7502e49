# 2026-12-05b: after g3 (same warm machine, /tmp/rep holds the VAE's sitting): the layout probe with the
# VAE's cast installed in both arms, so that the GroupNorm variants serve contiguous inputs and the
# channels-last twins serve the channels-last arm -- what an eager layout route would give.
source .devrun/setup.sh >/dev/null 2>&1
rm -rf /tmp/o; mkdir -p /tmp/o
c=/tmp/rep/sd35_vae/sd35_vae.cast; ls -la $c
timeout 200 python3 scripts/probe_conv_layout.py --config configs/examples/sd35_vae.toml --cast "$c" \
    --out /tmp/o/layout-cast > /tmp/o/layout-cast.log 2>&1; head -3 /tmp/o/layout-cast.log | cut -c1-250
grep -A3 stats_hits /tmp/o/layout-cast/*.json | head -20
cd /tmp && tar czf $OUT/o.tgz o
