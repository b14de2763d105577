#!/bin/bash
# Per-kernel durations of the GPT-2 forward under ncu, without its clock locking and cache
# flushes (ncu serializes kernels: the figures hold no launch gaps). Stage example:models first;
# the CSV comes back in $OUT/ncu.csv (the last 96 launches are one forward).
/usr/local/cuda/bin/ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --print-units base \
  .device/bin/models --device cuda --rows gpt2_124m_fwd_bf16 --warmup 0 --reps 3 > $OUT/ncu.csv 2> $OUT/ncu.err
tail -3 $OUT/ncu.err; wc -l $OUT/ncu.csv
