/* Host emulation of the argsort template (codegen/src/templates/sort.cu) for the test
   runtime/src/cuda/sort_emulation.rs: the CUDA built-ins the kernels use, in C++, one
   std::thread per CUDA thread with a real block barrier (codegen/src/templates/block_emulation.h),
   blocks one after another. The test writes block_emulation.h, this file, the template's source and the runner
   below into one translation unit. Usage: emu KERNEL LINES LEN INNER TILES WIDTH THREADS DESCENDING IN OUT [RUN...]: the
   input's raw bytes are read from IN, the i64 positions written to OUT, one merge pass per RUN. */
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#define COIL_SORT_EMULATED 1

/* Runs `kernel` over a grid of `grid` blocks of `block` threads, a block at a time. */
inline void coil_emu_launch(unsigned grid, unsigned block, const std::function<void()> &kernel) {
    gridDim = {grid, 1, 1};
    blockDim = {block, 1, 1};
    for (unsigned b = 0; b < grid; b++) {
        blockIdx = {b, 0, 0};
        CoilEmuBarrier barrier(block);
        coil_emu_block = &barrier;
        std::vector<std::thread> threads;
        for (unsigned t = 0; t < block; t++) {
            threads.emplace_back([t, &kernel] {
                threadIdx = {t, 0, 0};
                kernel();
            });
        }
        for (auto &th : threads) th.join();
    }
}
