# 2026-12-05g, second and later calls on the same warm machine: the pinned commit's sitting of MODEL resumes
# where the last call stopped (its workspace and /tmp/rep stay on the machine). MODEL=sd35_vae bash g2.sh
source .devrun/setup.sh >/dev/null 2>&1
rm -rf /tmp/o; mkdir -p /tmp/o; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > /tmp/o/gpu.txt 2>&1
(cd .pin && PYTHONPATH=/tmp/site:$PWD KFORGE_COMMIT=$(cat COMMIT) timeout 575 python3 scripts/reproduce.py \
  --out /tmp/rep --models ${MODEL:-sd35_vae} --deadline 560 > /tmp/o/rep-$(date +%s).log 2>&1)
tail -4 /tmp/o/rep-*.log; echo "t=$SECONDS"
cp -r /tmp/rep /tmp/o/; cd /tmp && tar czf $OUT/o.tgz o
