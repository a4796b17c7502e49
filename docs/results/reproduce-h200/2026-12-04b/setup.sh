python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -3
export PYTHONPATH=/tmp/site:$PWD KFORGE_PROGRESS=1 TORCH_EXTENSIONS_DIR=/tmp/ext
[ -d .devrun/ext ] && [ ! -d /tmp/ext ] && cp -r .devrun/ext /tmp/ext
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader
python3 -c "import torch;print(torch.__version__)"
