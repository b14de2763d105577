#!/usr/bin/env bash
# Every row of the models table (GPT-2 forward, step, step with dropout; decode and prefill; ResNet-50),
# one side per call (each side takes ~4-6 min on an H200, over the 10-minute limit together):
#   bash bench/tools/device_models_all.sh coil    # .device/bin/models, --replay, cold caches -> $OUT/coil.json
#   bash bench/tools/device_models_all.sh torch   # bench/models_torch.py, torch.compile, cold   -> $OUT/torch.json
# then here: python3 bench/models_table.py torch.json coil.json --date <suffix>.
# Stage first: ../shared/device/stage.sh example:models; carry [".device"].
set -u -o pipefail
export PYTHONUNBUFFERED=1
export VIRTUAL_ENV=${VIRTUAL_ENV:-$(python3 -c "import sys; print(sys.prefix)")}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
case "${1:-}" in
  coil)
    # A throwaway run first reads the CUDA libraries from disk, so the compile column is a cold compile.
    # The decode rows replay from CUDA graphs, as torch.compile's mode='reduce-overhead' on the other side; the
    # training rows do not (torch.compile's default mode there).
    TRAIN=gpt2_124m_fwd_bf16,gpt2_124m_train_step_bf16,gpt2_124m_train_step_dropout_bf16,resnet50_fwd_bf16,resnet50_train_step_bf16
    DECODE=gpt2_124m_decode_b1_bf16,gpt2_124m_decode_b16_bf16,llama_1b_decode_b1_bf16,llama_1b_decode_b16_bf16,llama_1b_prefill_bf16
    # (every training row: each loads libraries of its own, cuDNN's backward engines among them).
    .device/bin/models --device cuda --replay --cold --rows $TRAIN --warmup 1 --reps 2 > /dev/null 2>&1
    timeout 360 .device/bin/models --device cuda --replay --cold --rows $TRAIN --warmup 5 --reps 20 --json /tmp/train.json 2>&1 \
      | grep -E "ms device|of which|replayed"
    timeout 180 .device/bin/models --device cuda --replay --cuda-graphs --cold --rows $DECODE --warmup 5 --reps 20 \
      --json /tmp/decode.json 2>&1 | grep -E "ms/token|ms device"
    python3 -c "import json,sys; a,b=(json.load(open(f)) for f in sys.argv[1:3]); a['rows']+=b['rows']; json.dump(a,open(sys.argv[3],'w'),indent=1)" \
      /tmp/train.json /tmp/decode.json $OUT/coil.json ;;
  torch)
    timeout 560 python3 bench/models_torch.py --device cuda --modes compile --json $OUT/torch.json 2>&1 \
      | grep -v -i warn | tail -16 ;;
  *) echo "usage: device_models_all.sh coil|torch" >&2; exit 2 ;;
esac
