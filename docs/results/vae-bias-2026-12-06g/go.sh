# 2026-12-06g: the GPU tamper test again (e50856f: a launch spec naming a kernel the manifest does not is not
# prepared), then bias_probe.py on the VAE cast of vae-compose-2026-12-06b. carry: .whl. Files: $OUT/g.tgz
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests PYTHONUNBUFFERED=1
G=/tmp/g; mkdir -p $G; trap 'tar czf $OUT/g.tgz -C /tmp g' EXIT
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,clocks.max.sm --format=csv > $G/gpu.txt 2>&1; cat $G/gpu.txt
git rev-parse HEAD > $G/commit.txt 2>/dev/null
[ -e $G/tests.done ] || { timeout 200 python3 scripts/gpu_tests.py --out $G/tests --timeout 120 \
  tests/test_cast_tamper_gpu.py > $G/tests.log 2>&1 && touch $G/tests.done; tail -16 $G/tests.log; }
timeout 330 python3 docs/results/vae-bias-2026-12-06g/bias_probe.py docs/results/vae-compose-2026-12-06b/sd35_vae.cast \
  $G/probe > $G/probe.log 2>&1; echo "probe rc=$?"; grep -v Warning $G/probe.log | tail -60
