# Next session's first call (~9.5 min): the on-device draws of fresh and edge sets (3a5a25f) on a GPU, then MODEL's
# sitting (default sd35_vae) from the pinned code in .pin (made by pin.sh), resumed by g2.sh on the same warm machine.
source .devrun/setup.sh >/dev/null 2>&1
rm -rf /tmp/o; mkdir -p /tmp/o
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > /tmp/o/gpu.txt 2>&1
PYTHONPATH=$PYTHONPATH:$PWD/tests timeout 120 python3 scripts/gpu_tests.py --out /tmp/o/a tests/test_inputs_on_device.py >> /tmp/o/gt.log 2>&1
tail -n +5 /tmp/o/a/gpu_tests.md | cut -c1-250
left=$((575 - SECONDS))
(cd .pin && PYTHONPATH=/tmp/site:$PWD KFORGE_COMMIT=$(cat COMMIT) timeout $left python3 scripts/reproduce.py \
  --out /tmp/rep --models ${MODEL:-sd35_vae} --deadline $((left - 15)) > /tmp/o/rep-$(date +%s).log 2>&1)
tail -4 /tmp/o/rep-*.log; echo "t=$SECONDS"
cp -r /tmp/rep /tmp/o/; cd /tmp && tar czf $OUT/o.tgz o
