# 2026-12-05h, first call on a fresh machine (~9.5 min): the on-device draws' GPU test (3a5a25f), the channels-last
# GroupNorm A/B (ab.sh, where .pin-old exists), then the sittings of the pinned code in .pin (made by
# ../2026-12-05g/pin.sh from the newest sitting tag). MODELS, when not given: on an H200 the SD3.5 VAE (issue 19's
# target is an H200's), elsewhere ResNet-50 then the small examples, in that order.
# Later calls on the same warm machine: MODELS=... bash g.sh (the sittings resume where they stopped).
source .devrun/setup.sh >/dev/null 2>&1
rm -rf /tmp/o; mkdir -p /tmp/o
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > /tmp/o/gpu.txt 2>&1
cat /tmp/o/gpu.txt
PYTHONPATH=$PYTHONPATH:$PWD/tests timeout 120 python3 scripts/gpu_tests.py --out /tmp/o/a tests/test_inputs_on_device.py >> /tmp/o/gt.log 2>&1
tail -n +5 /tmp/o/a/gpu_tests.md | cut -c1-250
[ -d .pin-old ] && bash docs/results/reproduce-h200/2026-12-05h/ab.sh   # the channels-last GroupNorm A/B, ~3 min
if [ -z "$MODELS" ]; then
  if grep -q H200 /tmp/o/gpu.txt; then MODELS=sd35_vae; else MODELS=resnet50,vit_b16,convnext_tiny,whisper_encoder,deeplabv3; fi
fi
echo "MODELS=$MODELS"
left=$((575 - SECONDS))
(cd .pin && PYTHONPATH=/tmp/site:$PWD KFORGE_COMMIT=$(cat COMMIT) timeout $left python3 scripts/reproduce.py \
  --out /tmp/rep --models $MODELS --deadline $((left - 15)) > /tmp/o/rep-$(date +%s).log 2>&1)
tail -6 /tmp/o/rep-*.log; echo "t=$SECONDS"
cp -r /tmp/rep /tmp/o/; cd /tmp && tar czf $OUT/o.tgz o
