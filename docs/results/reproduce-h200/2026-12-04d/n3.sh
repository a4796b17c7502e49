source .devrun/setup.sh >/dev/null 2>&1
rm -rf /tmp/o; mkdir -p /tmp/o
export PYTHONPATH=$PYTHONPATH:$PWD/tests
python3 -c "import transformers;print('transformers', transformers.__version__)"
timeout 260 python3 scripts/bench_decode.py --out /tmp/o/decode --model configs/models/qwen35_a3b.toml \
    --prompt 128 --tokens 32 --rounds 3 > /tmp/o/decode.log 2>&1; tail -14 /tmp/o/decode.log
timeout $((560 - SECONDS)) python3 scripts/bench_compose.py --out /tmp/o/resnet50-control --model configs/models/resnet50.toml \
    --cast docs/results/reproduce-h200/2026-12-03g/resnet50/resnet50.cast --modes default,reduce-overhead --max-s 5 --control > /tmp/o/control.log 2>&1
grep -E "control|torch.compile" /tmp/o/control.log | tail -18
cd /tmp && tar czf $OUT/o.tgz o
