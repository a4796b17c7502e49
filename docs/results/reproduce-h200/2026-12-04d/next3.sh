# Third command of the next GPU session (written at the end of 2026-12-04d, not run): a cast for generate().
# A sitting of the decoding-step config (one token after a 2048-token prefill; engine/models/decode.py), the
# chain cards only (the [1,1,H] RMSNorm module cards), exported for eager; then eager generate() with transformers'
# default (dynamic) cache, with and without that cast, per token. About 9 minutes; setup as next.sh.
source .devrun/setup.sh
rm -rf /tmp/o /tmp/rep; mkdir -p /tmp/o
timeout 430 python3 scripts/reproduce.py --out /tmp/rep --models gemma4_e2b_decode --targets eager --ops chain \
    --wall-time 150 --deadline 410 --no-graph-routes --pack /tmp/o/rep > /tmp/o/rep.log 2>&1; tail -5 /tmp/o/rep.log
CAST=$(ls /tmp/rep/gemma4_e2b_decode/*.cast 2>/dev/null | head -1)
[ -n "$CAST" ] && timeout $((585 - SECONDS)) python3 scripts/bench_decode.py --out /tmp/o/decode-cast \
    --model configs/examples/gemma4_e2b_decode.toml --prompt 128 --tokens 32 --rounds 3 --cache dynamic \
    --cast "$CAST" > /tmp/o/decode-cast.log 2>&1; tail -12 /tmp/o/decode-cast.log
cd /tmp && tar czf $OUT/o.tgz o
