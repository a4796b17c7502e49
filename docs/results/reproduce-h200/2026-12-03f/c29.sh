source .devrun/setup.sh >/dev/null 2>&1
timeout 290 python3 -m kforge_tui run --no-tui --workspace /tmp/kforge-reproduce/sd35_medium --resume run-97c45de75597 --wall-time 270 2>&1 | tail -8
echo "run done at $SECONDS"
timeout $((575 - SECONDS)) python3 scripts/reproduce.py --out /tmp/rep --models sd35_medium --ops group_norm --targets compile --wall-time 240 --deadline $((565 - SECONDS)) --pack /tmp/o/rep 2>&1 | tail -20
echo "elapsed $SECONDS"
tar czf /tmp/o/rep_full.tgz --exclude='*.pt' --exclude='*.safetensors' --exclude='kforge.db*' -C /tmp/rep . 2>/dev/null
bash .devrun/pack.sh
