#!/usr/bin/env bash
# Stage first: ../shared/device/stage.sh example:models; carry [".device"]; run: DATE=<file suffix> bash bench/tools/device_models_cold.sh (~100 s on an H100).
# Models table with both sides' libraries already read from disk once on this machine (a throwaway run of each
# first): the compile columns are then cold compiles (fresh caches), not first reads of the CUDA libraries.
set -u
export VIRTUAL_ENV=${VIRTUAL_ENV:-$(python3 -c "import sys; print(sys.prefix)")}
ROWS=gpt2_124m_fwd_bf16,gpt2_124m_train_step_bf16,gpt2_124m_train_step_dropout_bf16
.device/bin/models --device cuda --replay --cold --rows $ROWS --warmup 1 --reps 2 > /dev/null 2>&1
python3 bench/models_torch.py --rows gpt2_124m_fwd_bf16 --modes compile --reps 2 --json /tmp/throwaway.json > /dev/null 2>&1
.device/bin/models --device cuda --replay --cold --rows $ROWS --warmup 5 --reps 20 --json $OUT/coil.json 2>&1 | grep -E "ms device|of which"
python3 bench/models_torch.py --rows $ROWS --modes compile --json $OUT/torch.json 2>&1 | tail -3
python3 bench/models_table.py $OUT/torch.json $OUT/coil.json --out-dir $OUT --date ${DATE:-$(date +%F)} 2>&1 | grep -A3 "^row  "
