#!/bin/bash
# A/B of programmatic dependent launches (COIL_PDL=0 against the default), interleaved.
export COIL_CACHE_DIR=/tmp/coil-cache
M=".device/bin/models --device cuda --rows gpt2_124m_fwd_bf16,gpt2_124m_train_step_bf16 --warmup 5 --reps 20"
$M > /dev/null 2>&1   # compile into the cache
for round in 1 2 3; do
  for pdl in 0 1; do
    for mode in "" "--replay"; do
      COIL_PDL=$pdl $M $mode 2>&1 | grep -E "^gpt2" | sed "s/^/pdl=$pdl ${mode:-plain} /"
    done
  done
done
