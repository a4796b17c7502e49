source .devrun/setup.sh
rm -rf /tmp/o/*; mkdir -p /tmp/o
timeout 400 python3 docs/results/reproduce-h200/2026-12-04/diag_wake.py 2>&1 | grep -v Warning | tail -60
echo "elapsed $SECONDS"
bash .devrun/pack.sh
