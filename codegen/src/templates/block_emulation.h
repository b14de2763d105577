/* A CUDA thread block on the host, for the template emulation tests (the runtime's
   attention_emulation.rs, sort_emulation.rs): the CUDA keywords as C++, the thread and block indices (a std::thread per
   CUDA thread, each with its own threadIdx), and a real block barrier for __syncthreads. Each test
   puts this first in its translation unit, then its own helpers, the template and a runner. */
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)
#define __restrict__
struct coil_dim3 { unsigned x, y, z; };
inline thread_local coil_dim3 threadIdx;
inline coil_dim3 blockIdx, gridDim, blockDim;

/* A reusable barrier of n threads (generation counting); each generation also ORs the values
   its threads arrive with (a waiter reads the result before it can arrive again, so before
   the next generation completes). */
struct CoilEmuBarrier {
    explicit CoilEmuBarrier(unsigned n) : n(n) {}
    int arrive_and_wait(int value = 0) {
        std::unique_lock<std::mutex> lock(m);
        const unsigned gen = generation;
        any |= value != 0;
        if (++arrived == n) {
            arrived = 0;
            result = any;
            any = 0;
            ++generation;
            cv.notify_all();
        } else {
            cv.wait(lock, [&] { return generation != gen; });
        }
        return result;
    }
    std::mutex m;
    std::condition_variable cv;
    unsigned n, arrived = 0, generation = 0;
    int any = 0, result = 0;
};

/* The running block's barrier. */
inline CoilEmuBarrier *coil_emu_block;
inline void __syncthreads() { coil_emu_block->arrive_and_wait(); }
inline int __syncthreads_or(int predicate) { return coil_emu_block->arrive_and_wait(predicate); }

/* The bytes of the file at `path` (exit status 3 if it cannot be opened): the emulation
   runners read their operands this way. */
static std::vector<unsigned char> coil_emu_read(const char *path) {
    FILE *f = std::fopen(path, "rb");
    if (!f) std::exit(3);
    std::vector<unsigned char> bytes;
    unsigned char chunk[65536];
    size_t n;
    while ((n = std::fread(chunk, 1, sizeof chunk, f)) > 0) bytes.insert(bytes.end(), chunk, chunk + n);
    std::fclose(f);
    return bytes;
}
