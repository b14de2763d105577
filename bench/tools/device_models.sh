#!/usr/bin/env bash
# The models table on the GPU machine: coil's GPT-2 124M rows (examples/models) and PyTorch's
# (bench/models_torch.py, eager and torch.compile) in one call, merged by bench/models_table.py.
# Stage first: ../shared/device/stage.sh example:models; then carry [".device"] and run
#   bash bench/tools/device_models.sh [models_torch.py arguments, e.g. --rows '*decode*,*prefill*']
# All the torch rows take ~4-5 min on an H100 (estimate; see bench/models_torch.py): with coil's side, split
# the rows over two calls if one would pass the 10-minute limit of a device command.
set -o pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "== coil"
timeout 240 .device/bin/models --json "$out/coil_models.json" 2>&1 | tail -4
echo "== torch"
timeout 480 python3 bench/models_torch.py --device cuda --json "$out/models_torch.json" "$@" 2>&1 | grep -v -i warn | tail -20
python3 bench/models_table.py "$out/models_torch.json" "$out/coil_models.json" --out-dir "$out" > "$out/models_table.log" 2>&1
sed -n '/^row/,/^$/p' "$out/models_table.log"; grep -i '^models_table: warning' "$out/models_table.log"
