# 2026-12-05h, second and later calls on the same warm machine: the pinned sittings of MODELS resume where the
# last call stopped (workspaces and /tmp/rep stay on the machine). MODELS=sd35_vae bash g.sh
source .devrun/setup.sh >/dev/null 2>&1
rm -rf /tmp/o; mkdir -p /tmp/o; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > /tmp/o/gpu.txt 2>&1
(cd .pin && PYTHONPATH=/tmp/site:$PWD KFORGE_COMMIT=$(cat COMMIT) timeout 575 python3 scripts/reproduce.py \
  --out /tmp/rep --models ${MODELS:?say MODELS} --deadline 560 > /tmp/o/rep-$(date +%s).log 2>&1)
tail -6 /tmp/o/rep-*.log; echo "t=$SECONDS"
cp -r /tmp/rep /tmp/o/; cd /tmp && tar czf $OUT/o.tgz o
