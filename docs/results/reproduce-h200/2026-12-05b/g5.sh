# 2026-12-05b: the SD3.5 VAE in one sitting, eager only (the session had about 17 device minutes): run (GroupNorm
# cards, 180 s of search), export --target eager with the layout-route check (no graph routes), bench_e2e (eager
# and eager + cast, which now runs the decoder channels-last where the export kept it). What does not fit in the
# deadline is recorded as not run.
source .devrun/setup.sh >/dev/null 2>&1
timeout 580 python3 scripts/reproduce.py --out /tmp/rep --models sd35_vae --targets eager --wall-time 180 \
    --no-graph-routes --deadline 555 > /tmp/rep-$(date +%s).log 2>&1
tail -6 /tmp/rep-*.log
rm -rf /tmp/o; mkdir -p /tmp/o; cp -r /tmp/rep /tmp/o/; cp /tmp/rep-*.log /tmp/o/
rm -f /tmp/o/rep/*/*.db-wal; find /tmp/o -name "*.cast" -size +16M -delete
cd /tmp && tar czf $OUT/o.tgz o
