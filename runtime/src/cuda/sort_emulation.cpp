/* Host emulation of the argsort template (codegen/src/templates/sort.cu) for the test
   runtime/src/cuda/sort_emulation.rs: the CUDA built-ins the kernels use, in C++, one
   std::thread per CUDA thread with a real block barrier, blocks one after another. The test
   writes this file, then the template's source, then the runner below, into one translation
   unit. Usage: emu KERNEL LINES LEN INNER TILES WIDTH THREADS DESCENDING IN OUT [RUN...]: the
   input's raw bytes are read from IN, the i64 positions written to OUT, one merge pass per RUN. */
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#define COIL_SORT_EMULATED 1
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __restrict__
struct coil_dim3 { unsigned x, y, z; };
thread_local coil_dim3 threadIdx;
coil_dim3 blockIdx, gridDim, blockDim;

/* A reusable barrier of n threads (generation counting). */
struct CoilEmuBarrier {
    explicit CoilEmuBarrier(unsigned n) : n(n) {}
    void arrive_and_wait() {
        std::unique_lock<std::mutex> lock(m);
        const unsigned gen = generation;
        if (++arrived == n) {
            arrived = 0;
            ++generation;
            cv.notify_all();
        } else {
            cv.wait(lock, [&] { return generation != gen; });
        }
    }
    std::mutex m;
    std::condition_variable cv;
    unsigned n, arrived = 0, generation = 0;
};
CoilEmuBarrier *coil_emu_block;
inline void __syncthreads() { coil_emu_block->arrive_and_wait(); }

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
