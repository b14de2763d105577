/* The runner of the sorted scatter's host emulation (runtime/src/cuda/scatter_emulation.rs):
   the launches coil_runtime::cuda::fallback makes for a float scatter_reduce (row keys, the
   argsort template's tile and merge kernels, the sorted keys, the combine), on host memory,
   each kernel's grid cut to a few blocks so that the grid-stride loops take several turns.
   Follows block_emulation.h, attention_emulation.h (the 16-bit conversions), the sort and
   scatter templates. Usage: emu COMBINE NDIM DIM OUTER LEN INNER ROWS VECTOR DIM_SIZE GX BX BY
   TILES WIDTH THREADS DIMS X INDEX SRC OUT [RUN...]: the combine kernel and the plan's fields
   (VECTOR > 1: the rows kernel; GX its grid's x, kept whole), DIMS a file of the 24 i64 of CoilScatterDims,
   X, INDEX, SRC the operands' raw bytes; OUT gets the result's bytes, then the 4 status words;
   one merge pass per RUN. */
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

/* Runs `kernel` over a grid of gx * gy blocks of bx * by threads, a block at a time. */
inline void coil_emu_launch(unsigned gx, unsigned gy, unsigned bx, unsigned by, const std::function<void()> &kernel) {
    gridDim = {gx, gy, 1};
    blockDim = {bx, by, 1};
    for (unsigned b = 0; b < gx * gy; b++) {
        blockIdx = {b % gx, b / gx, 0};
        CoilEmuBarrier barrier(bx * by);
        coil_emu_block = &barrier;
        std::vector<std::thread> threads;
        for (unsigned t = 0; t < bx * by; t++) {
            threads.emplace_back([t, bx, &kernel] {
                threadIdx = {t % bx, t / bx, 0};
                kernel();
            });
        }
        for (auto &th : threads) th.join();
    }
}

static unsigned coil_emu_min(long long a, unsigned b) { return a < (long long)b ? (unsigned)a : b; }

int main(int argc, char **argv) {
    const int fixed = 21;
    if (argc < fixed) return 2;
    const std::string combine = argv[1];
    const int ndim = std::atoi(argv[2]), dim = std::atoi(argv[3]);
    const long long outer = std::atoll(argv[4]), len = std::atoll(argv[5]), inner = std::atoll(argv[6]);
    const bool rows = std::atoi(argv[7]) != 0, vector = std::atoi(argv[8]) > 1;
    const long long dim_size = std::atoll(argv[9]);
    const unsigned grid_x = (unsigned)std::atoi(argv[10]);
    const unsigned bx = (unsigned)std::atoi(argv[11]), by = (unsigned)std::atoi(argv[12]);
    const long long tiles = std::atoll(argv[13]);
    const int width = std::atoi(argv[14]), threads = std::atoi(argv[15]);
    std::vector<unsigned char> dims_bytes = coil_emu_read(argv[16]);
    if (dims_bytes.size() != sizeof(CoilScatterDims)) return 4;
    CoilScatterDims d;
    std::memcpy(&d, dims_bytes.data(), sizeof d);
    std::vector<unsigned char> out = coil_emu_read(argv[17]);
    std::vector<unsigned char> index_bytes = coil_emu_read(argv[18]);
    std::vector<unsigned char> src = coil_emu_read(argv[19]);
    std::vector<long long> index(index_bytes.size() / 8);
    std::memcpy(index.data(), index_bytes.data(), index_bytes.size());

    /* 1. The keys: element 0 of each index row, or the index itself. */
    const long long stride = rows ? 1 : inner, n = outer * len * stride;
    std::vector<long long> row_keys(rows && inner > 1 ? n : 0, -9);
    const long long *keys = index.data();
    if (rows && inner > 1) {
        coil_emu_launch(coil_emu_min((n + 63) / 64, 2), 1, 64, 1,
                        [&] { coil_scatter_row_keys(index.data(), row_keys.data(), n, inner); });
        keys = row_keys.data();
    }
    /* 2. Their argsort along each line (coil_runtime::cuda::sort::argsort's launches). */
    std::vector<long long> pos(n, -7);
    std::vector<coil_u64> sk[2] = {std::vector<coil_u64>(n, 0xdeadULL), std::vector<coil_u64>(n, 0xdeadULL)};
    std::vector<unsigned> sp[2] = {std::vector<unsigned>(n, 0xdead), std::vector<unsigned>(n, 0xdead)};
    const long long lines = outer * stride;
    coil_emu_launch(coil_emu_min(lines * tiles, 3), 1, threads, 1, [&] {
        coil_sort_tile_i64(keys, sk[0].data(), sp[0].data(), pos.data(), lines, len, stride, tiles, width, 0);
    });
    const int passes = argc - fixed;
    for (int k = 0; k < passes; k++) {
        const long long run = std::atoll(argv[fixed + k]);
        const int a = k % 2, b = (k + 1) % 2, last = k + 1 == passes;
        coil_emu_launch(2, 1, 64, 1, [&] {
            coil_sort_merge(sk[a].data(), sp[a].data(), sk[b].data(), sp[b].data(), pos.data(), lines, len, stride,
                            run, last);
        });
    }
    /* 3. The keys in sorted order, an index out of range reported. */
    std::vector<long long> sorted(n, -5), status(4, 0);
    coil_emu_launch(coil_emu_min((n + 63) / 64, 2), 1, 64, 1, [&] {
        coil_scatter_sorted_keys(keys, pos.data(), sorted.data(), n, len, stride, dim_size, status.data());
    });
    /* 4. The combine, on at most 2 x 3 blocks of the plan's shape (the rows kernel's x whole: a
       thread keeps its columns). */
    const unsigned gx = vector ? grid_x : coil_emu_min((inner + bx - 1) / bx, 2);
    const unsigned gy = coil_emu_min((outer * len + by - 1) / by, 3);
    void *o = out.data();
    const void *s = src.data();
    bool launched = false;
#define COIL_EMU_COMBINE(NAME, T)                                                                  \
    if (combine == #NAME) {                                                                       \
        launched = true;                                                                          \
        coil_emu_launch(gx, gy, bx, by, [&] {                                                     \
            NAME((T *)o, (const T *)s, pos.data(), sorted.data(), ndim, dim, outer, len, inner, stride, \
                 dim_size, d);                                                                    \
        });                                                                                       \
    }
#define COIL_EMU_ROWS(NAME, T)                                                                     \
    if (combine == #NAME) {                                                                       \
        launched = true;                                                                          \
        coil_emu_launch(gx, gy, bx, by, [&] {                                                     \
            NAME((T *)o, (const T *)s, pos.data(), sorted.data(), ndim, dim, outer, len, inner, dim_size, d); \
        });                                                                                       \
    }
    COIL_EMU_ROWS(coil_scatter_rows_add_f32, float)
    COIL_EMU_ROWS(coil_scatter_rows_add_f64, double)
    COIL_EMU_ROWS(coil_scatter_rows_add_f16, unsigned short)
    COIL_EMU_ROWS(coil_scatter_rows_add_bf16, unsigned short)
    COIL_EMU_ROWS(coil_scatter_rows_prod_f32, float)
    COIL_EMU_ROWS(coil_scatter_rows_prod_f64, double)
    COIL_EMU_ROWS(coil_scatter_rows_prod_f16, unsigned short)
    COIL_EMU_ROWS(coil_scatter_rows_prod_bf16, unsigned short)
    COIL_EMU_ROWS(coil_scatter_rows_amax_f32, float)
    COIL_EMU_ROWS(coil_scatter_rows_amax_f64, double)
    COIL_EMU_ROWS(coil_scatter_rows_amax_f16, unsigned short)
    COIL_EMU_ROWS(coil_scatter_rows_amax_bf16, unsigned short)
    COIL_EMU_ROWS(coil_scatter_rows_amin_f32, float)
    COIL_EMU_ROWS(coil_scatter_rows_amin_f64, double)
    COIL_EMU_ROWS(coil_scatter_rows_amin_f16, unsigned short)
    COIL_EMU_ROWS(coil_scatter_rows_amin_bf16, unsigned short)
    COIL_EMU_COMBINE(coil_scatter_sorted_add_f32, float)
    COIL_EMU_COMBINE(coil_scatter_sorted_add_f64, double)
    COIL_EMU_COMBINE(coil_scatter_sorted_add_f16, unsigned short)
    COIL_EMU_COMBINE(coil_scatter_sorted_add_bf16, unsigned short)
    COIL_EMU_COMBINE(coil_scatter_sorted_prod_f32, float)
    COIL_EMU_COMBINE(coil_scatter_sorted_prod_f64, double)
    COIL_EMU_COMBINE(coil_scatter_sorted_prod_f16, unsigned short)
    COIL_EMU_COMBINE(coil_scatter_sorted_prod_bf16, unsigned short)
    COIL_EMU_COMBINE(coil_scatter_sorted_amax_f32, float)
    COIL_EMU_COMBINE(coil_scatter_sorted_amax_f64, double)
    COIL_EMU_COMBINE(coil_scatter_sorted_amax_f16, unsigned short)
    COIL_EMU_COMBINE(coil_scatter_sorted_amax_bf16, unsigned short)
    COIL_EMU_COMBINE(coil_scatter_sorted_amin_f32, float)
    COIL_EMU_COMBINE(coil_scatter_sorted_amin_f64, double)
    COIL_EMU_COMBINE(coil_scatter_sorted_amin_f16, unsigned short)
    COIL_EMU_COMBINE(coil_scatter_sorted_amin_bf16, unsigned short)
    if (!launched) return 5;
    FILE *f = std::fopen(argv[20], "wb");
    if (!f) return 3;
    std::fwrite(out.data(), 1, out.size(), f);
    std::fwrite(status.data(), 8, 4, f);
    std::fclose(f);
    return 0;
}
