# Issue 21's report: one sitting of the pinned code (.pin, made by ../reproduce-h200/2026-12-05g/pin.sh TAG; the tag
# is in .pin/COMMIT). carry: .whl, .pin. MODELS (comma-separated; default: on an H200 the SD3.5 VAE, elsewhere
# ResNet-50 and the small examples), DEADLINE seconds (default 540). A later call on the same warm machine resumes
# where the last stopped (workspaces and /tmp/rep stay there). Files: $OUT/o.tgz (the per-model packs, the logs).
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1; DEADLINE=${DEADLINE:-540}
rm -rf /tmp/o; mkdir -p /tmp/o; trap 'cp -r /tmp/rep /tmp/o/ 2>/dev/null; cd /tmp && tar czf $OUT/o.tgz o' EXIT
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,clocks.max.sm --format=csv > /tmp/o/gpu.txt 2>&1; cat /tmp/o/gpu.txt
if [ -z "$MODELS" ]; then
  if grep -q H200 /tmp/o/gpu.txt; then MODELS=sd35_vae; else MODELS=resnet50,vit_b16,convnext_tiny,whisper_encoder,deeplabv3; fi
fi
echo "models: $MODELS; pinned: $(cat .pin/COMMIT)"
(cd .pin && PYTHONPATH=/tmp/site:$PWD KFORGE_COMMIT=$(cat COMMIT) timeout -s INT -k 15 $((DEADLINE + 20)) python3 \
  scripts/reproduce.py --out /tmp/rep --models $MODELS --deadline $DEADLINE --pack /tmp/o/pack > /tmp/o/rep.log 2>&1)
echo "rc=$? t=$SECONDS"; grep -v Warning /tmp/o/rep.log | tail -15 | cut -c1-300
