# 2026-12-05h: the channels-last GroupNorm kernels before (tag sitting-2026-12-05h, in .pin-old) and after (register
# coefficients ad11c3a, partials in flight f2c2de9; the tag in .pin): the same GPU tests, one lane per tree, back to
# back on one machine. Each line prints a candidate's speedup over eager and its % of the lane's copy.
# Make the trees: bash ../2026-12-05g/pin.sh sitting-2026-12-05h && mv .pin .pin-old && bash ../2026-12-05g/pin.sh TAG
# ~3 min. Writes /tmp/o/ab-{old,new}-{gn,chain}.txt (n1.sh tars /tmp/o). pytest runs from /tmp: run from the
# repository, `python -m` would put the repository's engine ahead of the tree's.
repo=$PWD; mkdir -p /tmp/o
for tree in old new; do
  root=$repo/.pin; [ $tree = old ] && root=$repo/.pin-old
  (cd /tmp && PYTHONPATH=/tmp/site:$root:$repo/tests timeout 150 python3 -m pytest -q -s -p no:cacheprovider -n 0 -m gpu \
    $repo/tests/test_builtin_gpu_norms.py -k channels_last > /tmp/o/ab-$tree-gn.txt 2>&1)
  (cd /tmp && PYTHONPATH=/tmp/site:$root:$repo/tests timeout 90 python3 -m pytest -q -s -p no:cacheprovider -n 0 -m gpu \
    $repo/tests/test_builtin_chains_gpu.py -k channels_last_twin > /tmp/o/ab-$tree-chain.txt 2>&1)
done
for f in /tmp/o/ab-*.txt; do echo "== $f"; grep -E "^group_norm|^[a-z].*:|^  |passed|failed" $f | grep -v "^  File" | cut -c1-220 | head -40; done
