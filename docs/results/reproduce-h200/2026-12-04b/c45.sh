# Gemma under torch.compile: alone / cast installed / cast's backend / both, with Inductor's output code
source .devrun/setup.sh
rm -rf /tmp/o; mkdir -p /tmp/o/diag
D=docs/results/reproduce-h200/2026-12-04b
for arm in alone both installed backend; do
  TORCH_LOGS=output_code,graph_code timeout 140 python3 $D/diag_compile_diff.py $arm $D/gemma4_e2b/gemma4_e2b.cast 2> /tmp/o/diag/$arm.log | tee -a /tmp/o/diag/arms.txt
  echo "$arm done at $SECONDS"; [ $SECONDS -gt 330 ] && break
done
gzip /tmp/o/diag/*.log
bash .devrun/pack.sh
