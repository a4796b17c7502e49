# one sitting of the issue-19 models under compile and reduce-overhead, till ~575 s into the command
timeout $((${LIM:-585} - SECONDS)) python3 scripts/reproduce.py --out /tmp/rep --models ${MODELS:-resnet50,gemma4_e2b,qwen35_a3b} --targets eager,compile,compile:reduce-overhead --wall-time 150 --deadline $((${DL:-572} - SECONDS)) --pack /tmp/o/rep 2>&1 | tail -25
echo "elapsed $SECONDS"
tar czf /tmp/o/rep_full.tgz --exclude='*.pt' --exclude='*.safetensors' --exclude='kforge.db*' --exclude='*.cast' -C /tmp/rep . 2>/dev/null
bash .devrun/pack.sh
