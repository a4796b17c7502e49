source .devrun/setup.sh >/dev/null 2>&1
export KFORGE_CAST_DIR=/tmp/casts
LIM=585 DL=575 MODELS=qwen35_a3b source .devrun/rep.sh
