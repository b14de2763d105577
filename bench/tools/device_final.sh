# The end-of-session device call (copy to .device/, carry .device/bin, .device/tools, this script and .device/commit):
# the bench with torch and the compile table first, then the runtime tests, the GPU tests with the reasons kernels
# went through NVRTC, and train_mlp with a fresh kernel cache. Binaries: see bench/tools/ptxexp/README.md and docs.
set -o pipefail
export CUDA_CACHE_DISABLE=1
echo "== commit $(cat .device/commit)"
COIL_PROFILE=1 timeout 420 bash .device/tools/run.sh bench --warmup 5 --reps 30 --dynamic > $OUT/run.txt 2>&1
grep -v "^{" $OUT/run.txt | tail -16
python3 bench/tools/compile_table.py $OUT/anchors.json $OUT/coil.json | tee $OUT/compile.txt | tail -3
timeout 150 .device/bin/runtime_tests cuda --test-threads=1 2>&1 | grep -E "test result|FAILED|panicked" | head -20
COIL_LOGS=output_code timeout 300 .device/bin/gpu --test-threads=1 --nocapture > $OUT/gpu_full.txt 2>&1; echo rc=$?
grep -E "test result|FAILED|panicked|valid programs|disagree|golden \(" $OUT/gpu_full.txt | head -20
echo "== kernels still through NVRTC in the GPU tests, by reason"; grep -o "no PTX form: [^)]*" $OUT/gpu_full.txt | sort | uniq -c | sort -rn | head -20
grep -E "^test |panicked|assert|fmod|floor_divide|remainder\(" $OUT/gpu_full.txt | grep -v "output_code" | head -40 > $OUT/gpu.txt; rm $OUT/gpu_full.txt
echo "== train_mlp"; rm -rf /tmp/cc; /usr/bin/time -f "wall %e s" env COIL_CACHE_DIR=/tmp/cc timeout 100 .device/bin/train_mlp 2>&1 | tail -2
