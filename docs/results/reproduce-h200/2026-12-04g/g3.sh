# 2026-12-04g: the SD3.5 VAE through scripts/reproduce.py (run, export for eager / cuda-graphs / compile,
# bench_e2e, bench_compose), now with biased convolutions keeping their bias for the cast's channels-last
# twins, the GroupNorm -> SiLU chain twins and the flat apply pass. Twice on the same warm machine: each call
# resumes where the last stopped (the workspace and /tmp/rep stay). Issue 19's number is bench_compose's
# torch.compile default + cast against torch.compile alone (1.283-1.309x in the last three sittings); its
# layout record says biases_kept / inputs_as_held / outputs_copied per op.
source .devrun/setup.sh >/dev/null 2>&1
timeout 580 python3 scripts/reproduce.py --out /tmp/rep --models sd35_vae --deadline 560 > /tmp/rep-$(date +%s).log 2>&1
tail -4 /tmp/rep-*.log
rm -rf /tmp/o; mkdir -p /tmp/o; cp -r /tmp/rep /tmp/o/; cp /tmp/rep-*.log /tmp/o/
cd /tmp && tar czf $OUT/o.tgz o
