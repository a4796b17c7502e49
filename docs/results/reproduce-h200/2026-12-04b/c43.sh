# the mapping-argument GPU test alone (its log had not come back), then graph routes on SD3.5-Medium and ResNet-50
source .devrun/setup.sh >/dev/null; rm -rf /tmp/o; mkdir -p /tmp/o
timeout 120 python3 -m pytest -q -x tests/test_cast_graph_routes_gpu.py -k mapping 2>&1 | tail -40
timeout 200 python3 scripts/bench_graph_routes.py --out /tmp/o/gr_sd35 --model configs/models/sd35_medium.toml --modules auto --tries 3 --max-s 15 2>&1 | tail -5
timeout $((560-SECONDS)) python3 scripts/bench_graph_routes.py --out /tmp/o/gr_resnet --model configs/models/resnet50.toml --modules auto --tries 3 --max-s 15 2>&1 | tail -5
bash .devrun/pack.sh
