# Issue 21's search ablation beyond elementwise: landscapes of the norm/softmax/pool cards (every builtin kernel of
# each card, evaluated once through the lane), one file per card so that a card cut short spoils only itself.
# carry: .whl. Files: $OUT/land.tgz. LIMIT (default 560). Resumable on the same warm machine (--resume).
# Replays (CPU): python scripts/bench_search.py --replay land/*.json --seeds 100 --budget B --out OUT
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests PYTHONUNBUFFERED=1
LIMIT=${LIMIT:-560}; L=/tmp/land; mkdir -p $L; trap 'tar czf $OUT/land.tgz -C /tmp land' EXIT
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,clocks.max.sm --format=csv > $L/gpu.txt 2>&1; cat $L/gpu.txt
for c in "layer_norm:layer_norm" "rms_norm:rms_norm" "softmax fp32 [4096:softmax_router" "adaptive_avg_pool2d:pool" \
         "softmax fp32 [4,262144]:softmax_wide" "softmax fp32 [1,8:softmax_scores"; do
  only=${c%%:*}; name=${c##*:}; left=$((LIMIT - SECONDS)); [ $left -ge 40 ] || { echo "$name: $left s left"; continue; }
  echo "$(date +%T) t=$SECONDS $name" | tee -a $L/calls.txt
  timeout -s INT -k 10 $((left - 10)) python3 scripts/bench_search.py --model targets --only "$only" --timing-s 0.3 \
    --resume --landscape $L/$name.json > $L/$name.log 2>&1; echo "$name rc=$? t=$SECONDS" | tee -a $L/calls.txt
  tail -3 $L/$name.log | cut -c1-300
done
