source .devrun/setup.sh
export KFORGE_CAST_DIR=/tmp/casts
LIM=585 DL=572 MODELS=gemma4_e2b source .devrun/rep.sh
