# The default export on the GPU for the first time since it tries graph routes by default (8f30788), the
# whole model first (9168f71), and writes a cast of routes alone where no kernel is kept (8626d7f):
# a whisper_encoder sitting, eager target.
source .devrun/setup.sh
rm -rf /tmp/o /tmp/rep; mkdir -p /tmp/o
timeout $((585 - SECONDS)) python3 scripts/reproduce.py --out /tmp/rep --models whisper_encoder --targets eager --wall-time 100 --deadline $((560 - SECONDS)) --pack /tmp/o/rep 2>&1 | grep -v Warn | tail -14
echo "elapsed $SECONDS"
tar czf /tmp/o/rep_full.tgz --exclude='*.pt' --exclude='*.safetensors' --exclude='kforge.db*' -C /tmp/rep . 2>/dev/null
bash .devrun/pack.sh
