# Third command of the next GPU session (written at the end of 2026-12-04e, not run). About 7 minutes; setup as
# next.sh. Qwen3.5-35B-A3B (4 layers) with its eager-only cast (2026-12-04b: module cards and a graph route per
# decoder layer) under torch.compile default: issue 19's "never slower" on the last reference model not yet
# measured. The cast has nothing for compile, so the pair is one compile (~230 s on the H200), and bench_compose
# no longer compiles the model a second time to pay Inductor's start; the second Dynamo compile (the cast's module
# cards give the decoder classes another forward while it is installed) loads the first's code from the shared cache.
source .devrun/setup.sh >/dev/null 2>&1
rm -rf /tmp/o; mkdir -p /tmp/o
R=docs/results/reproduce-h200
timeout 560 python3 scripts/bench_compose.py --out /tmp/o/qwen --model configs/models/qwen35_a3b.toml \
    --cast $R/2026-12-04b/qwen35_a3b/qwen35_a3b.cast --modes default --max-s 10 > /tmp/o/qwen.log 2>&1
grep -E "eager:|default:" /tmp/o/qwen.log | tail -4
cd /tmp && tar czf $OUT/o.tgz o
