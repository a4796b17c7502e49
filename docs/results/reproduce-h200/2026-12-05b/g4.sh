# 2026-12-05b: sd35_medium through scripts/reproduce.py (issue 20's eager >= 2.2x; issue 19's compile + cast),
# now with chain and module cards, layout twins and the export's layout-route check (its MMDiT + VAE run
# channels-last in eager where that is faster with confidence). Twice (or more) on one warm machine: each call
# resumes where the last stopped (the workspace and /tmp/rep stay on the machine).
source .devrun/setup.sh >/dev/null 2>&1
timeout 580 python3 scripts/reproduce.py --out /tmp/rep --models sd35_medium --deadline 560 > /tmp/rep-$(date +%s).log 2>&1
tail -4 /tmp/rep-*.log
rm -rf /tmp/o; mkdir -p /tmp/o; cp -r /tmp/rep /tmp/o/; cp /tmp/rep-*.log /tmp/o/
cd /tmp && tar czf $OUT/o.tgz o
