# For the next GPU session, only if p1.sh shows the persist kernel faster than stream (then make it first in
# group_norm's strategy order for those sizes, and commit, before this). The SD3.5 VAE through
# scripts/reproduce.py: run, export (eager, cuda-graphs, compile), bench_e2e, bench_compose. One sitting per
# command on the same warm machine (the workspace and /tmp/rep stay): run this twice; each call resumes where
# the last stopped. Issue 19's number: bench_compose's torch.compile default + cast against torch.compile alone.
# Setup as 2026-12-04e/next.sh.
source .devrun/setup.sh >/dev/null 2>&1
timeout 580 python3 scripts/reproduce.py --out /tmp/rep --models sd35_vae --deadline 560 > /tmp/rep-$(date +%s).log 2>&1
tail -4 /tmp/rep-*.log
rm -rf /tmp/o; mkdir -p /tmp/o; cp -r /tmp/rep /tmp/o/; cp /tmp/rep-*.log /tmp/o/
cd /tmp && tar czf $OUT/o.tgz o
