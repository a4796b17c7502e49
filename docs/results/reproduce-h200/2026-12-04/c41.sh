# Gemma 4 E2B (4 layers) sitting: eager, compile, reduce-overhead exports with the two-process, steady-state check
export TORCH_EXTENSIONS_DIR=/tmp/ext
[ -d .devrun/ext ] && cp -r .devrun/ext /tmp/ext
source .devrun/setup.sh
rm -rf /tmp/o/* /tmp/rep; mkdir -p /tmp/o
LIM=585 DL=572 MODELS=gemma4_e2b source .devrun/rep.sh
