source .devrun/setup.sh
export KFORGE_CAST_DIR=/tmp/casts
MODELS=resnet50 source .devrun/rep.sh
MODELS=gemma4_e2b source .devrun/rep.sh
