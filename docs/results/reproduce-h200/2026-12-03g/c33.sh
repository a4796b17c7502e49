source .devrun/setup.sh
export KFORGE_CAST_DIR=/tmp/casts
LIM=495 DL=485 MODELS=gemma4_e2b source .devrun/rep.sh
