source .devrun/setup.sh
timeout 570 python3 scripts/reproduce.py --out /tmp/rep --models sd35_medium --ops group_norm --targets compile --wall-time 240 --deadline 560 --pack /tmp/o/rep 2>&1 | tail -25
echo "elapsed $SECONDS"
tar czf /tmp/o/rep_full.tgz --exclude='*.pt' --exclude='*.safetensors' -C /tmp/rep . 2>/dev/null
bash .devrun/pack.sh
