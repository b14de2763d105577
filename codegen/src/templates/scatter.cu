/* The sorted scatter (see codegen/src/templates/scatter.rs): scatter_add and scatter_reduce of
   floats with each destination's sources combined in the index's order by one thread, no
   atomics, so that the result's bits repeat from run to run and are the reference
   interpreter's. The index's positions are grouped by destination by the argsort template
   (sort.cu, launched between these kernels). Follows half.cuh. With COIL_SORT_EMULATED or
   COIL_EMULATED defined the includer provides the CUDA built-ins (the runtime's host emulation
   test). */
struct CoilScatterDims { long long size[8]; long long xstride[8]; long long sstride[8]; };

/* Sources one thread loads before it combines them (in flight together). */
#define COIL_SCATTER_BATCH 8

/* A rows scatter's keys: element 0 of each of the index's `n` rows of `inner` elements (the
   index repeats along its rows). */
extern "C" __global__ void coil_scatter_row_keys(const long long *__restrict__ index, long long *__restrict__ keys,
                                                 long long n, long long inner) {
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < n;
         e += (long long)gridDim.x * blockDim.x)
        keys[e] = index[e * inner];
}

/* The keys in sorted order: `keys` and `pos` (the argsort of `keys` along its lines of `len`
   elements `stride` apart) are [lines, len, stride]; `sorted[e] = keys` at position `pos[e]`
   of e's line. A key outside [0, dim_size) is reported in the status words (code 1, the
   index, the dim's size) and left for the combine kernel to skip. */
extern "C" __global__ void coil_scatter_sorted_keys(const long long *__restrict__ keys,
                                                    const long long *__restrict__ pos,
                                                    long long *__restrict__ sorted, long long n, long long len,
                                                    long long stride, long long dim_size, long long *status) {
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < n;
         e += (long long)gridDim.x * blockDim.x) {
        const long long line = e / (len * stride), i = stride == 1 ? 0 : e % stride;
        const long long j = keys[line * len * stride + pos[e] * stride + i];
        sorted[e] = j;
        if (j < 0 || j >= dim_size) {
            if (status[0] == 0) { status[0] = 1; status[1] = j; status[2] = dim_size; }
        }
    }
}

/* The combine: a thread per (row, column) of the index seen as [outer * len, inner] (`len` its
   size along the scattered dim), the row being (line, rank k) in the sorted order. Where rank
   k starts a run of equal keys, the thread combines x's element at (line, key, column) with
   the sources of the run, in the run's order (ascending positions: the sort is stable), and
   stores the result once; other threads have nothing to do. `stride` is 1 when the index
   repeats along its rows (one sort per line serves every column) and `inner` otherwise (a sort
   per column). Blocks are 2-D: x over columns, y over rows, both grid-stride. ACC is the type
   combined in; LOAD widens a T to it, STORE narrows, COMBINE combines and rounds to T's
   precision, as the interpreter rounds each step. */
#define COIL_SORTED_SCATTER(NAME, T, ACC, LOAD, STORE, COMBINE)                                    \
extern "C" __global__ void NAME(T *out, const T *__restrict__ src, const long long *__restrict__ pos, \
                                const long long *__restrict__ sorted, int ndim, int dim, long long outer, \
                                long long len, long long inner, long long stride, long long dim_size,   \
                                CoilScatterDims d) {                                                 \
    const long long rows = outer * len;                                                              \
    for (long long row = blockIdx.y * (long long)blockDim.y + threadIdx.y; row < rows;              \
         row += (long long)gridDim.y * blockDim.y) {                                                 \
        const long long o = outer == 1 ? 0 : row / len, k = row - o * len;                           \
        for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < inner;             \
             i += (long long)gridDim.x * blockDim.x) {                                               \
            const long long line = o * len * stride + (stride == 1 ? 0 : i);                        \
            const long long key = sorted[line + k * stride];                                         \
            if (k > 0 && sorted[line + (k - 1) * stride] == key) continue; /* not a run's first */  \
            if (key < 0 || key >= dim_size) continue;                      /* reported */           \
            /* The offsets of (o, i) in x and src: dims after `dim` from i, before it from o (the   \
               outermost of each takes the rest, no division). */                                    \
            long long xo = 0, so = 0, rem = i;                                                       \
            for (int a = ndim - 1; a > dim; --a) {                                                   \
                long long c = rem;                                                                   \
                if (a > dim + 1) { rem = c / d.size[a]; c -= rem * d.size[a]; }                      \
                xo += c * d.xstride[a];                                                              \
                so += c * d.sstride[a];                                                              \
            }                                                                                        \
            rem = o;                                                                                 \
            for (int a = dim - 1; a >= 0; --a) {                                                     \
                long long c = rem;                                                                   \
                if (a > 0) { rem = c / d.size[a]; c -= rem * d.size[a]; }                            \
                xo += c * d.xstride[a];                                                              \
                so += c * d.sstride[a];                                                              \
            }                                                                                        \
            T *p = out + xo + key * d.xstride[dim];                                                  \
            const T *s = src + so;                                                                   \
            const long long step = d.sstride[dim];                                                   \
            ACC acc = LOAD(*p);                                                                      \
            for (long long q = k;; q += COIL_SCATTER_BATCH) {                                        \
                /* The run's next sources: positions first (keys sorted: a run is contiguous),      \
                   then their values, all loads in flight before the combines. */                    \
                long long at[COIL_SCATTER_BATCH];                                                    \
                _Pragma("unroll") for (int u = 0; u < COIL_SCATTER_BATCH; u++) {                    \
                    const long long r = q + u;                                                       \
                    at[u] = r < len && sorted[line + r * stride] == key ? pos[line + r * stride] : -1; \
                }                                                                                    \
                T v[COIL_SCATTER_BATCH];                                                             \
                _Pragma("unroll") for (int u = 0; u < COIL_SCATTER_BATCH; u++)                      \
                    v[u] = at[u] >= 0 ? s[at[u] * step] : (T)0;                                      \
                _Pragma("unroll") for (int u = 0; u < COIL_SCATTER_BATCH; u++)                      \
                    if (at[u] >= 0) acc = COMBINE(acc, LOAD(v[u]));                                  \
                if (at[COIL_SCATTER_BATCH - 1] < 0) break;                                           \
            }                                                                                        \
            *p = STORE(acc);                                                                         \
        }                                                                                            \
    }                                                                                                \
}
/* Combines, as the interpreter's scatter: sums and products rounded to the dtype at each step
   (for f16 / bf16 the f32 result of two 16-bit values rounded once more, which is the f64
   result's rounding through f32); max and min propagate NaN and keep the stored value on a
   tie (PyTorch's kernels). */
#define COIL_SAME(v) (v)
#define COIL_ADD(a, b) ((a) + (b))
#define COIL_MUL(a, b) ((a) * (b))
#define COIL_MAX(a, b) ((a) != (a) ? (a) : ((b) != (b) || (b) > (a)) ? (b) : (a))
#define COIL_MIN(a, b) ((a) != (a) ? (a) : ((b) != (b) || (b) < (a)) ? (b) : (a))
#define COIL_ADD_F16(a, b) coil_f16_to_f32(coil_f32_to_f16((a) + (b)))
#define COIL_MUL_F16(a, b) coil_f16_to_f32(coil_f32_to_f16((a) * (b)))
#define COIL_ADD_BF16(a, b) coil_bf16_to_f32(coil_f32_to_bf16((a) + (b)))
#define COIL_MUL_BF16(a, b) coil_bf16_to_f32(coil_f32_to_bf16((a) * (b)))
COIL_SORTED_SCATTER(coil_scatter_sorted_add_f32, float, float, COIL_SAME, COIL_SAME, COIL_ADD)
COIL_SORTED_SCATTER(coil_scatter_sorted_add_f64, double, double, COIL_SAME, COIL_SAME, COIL_ADD)
COIL_SORTED_SCATTER(coil_scatter_sorted_add_f16, unsigned short, float, coil_f16_to_f32, coil_f32_to_f16, COIL_ADD_F16)
COIL_SORTED_SCATTER(coil_scatter_sorted_add_bf16, unsigned short, float, coil_bf16_to_f32, coil_f32_to_bf16, COIL_ADD_BF16)
COIL_SORTED_SCATTER(coil_scatter_sorted_prod_f32, float, float, COIL_SAME, COIL_SAME, COIL_MUL)
COIL_SORTED_SCATTER(coil_scatter_sorted_prod_f64, double, double, COIL_SAME, COIL_SAME, COIL_MUL)
COIL_SORTED_SCATTER(coil_scatter_sorted_prod_f16, unsigned short, float, coil_f16_to_f32, coil_f32_to_f16, COIL_MUL_F16)
COIL_SORTED_SCATTER(coil_scatter_sorted_prod_bf16, unsigned short, float, coil_bf16_to_f32, coil_f32_to_bf16, COIL_MUL_BF16)
COIL_SORTED_SCATTER(coil_scatter_sorted_amax_f32, float, float, COIL_SAME, COIL_SAME, COIL_MAX)
COIL_SORTED_SCATTER(coil_scatter_sorted_amax_f64, double, double, COIL_SAME, COIL_SAME, COIL_MAX)
COIL_SORTED_SCATTER(coil_scatter_sorted_amax_f16, unsigned short, float, coil_f16_to_f32, coil_f32_to_f16, COIL_MAX)
COIL_SORTED_SCATTER(coil_scatter_sorted_amax_bf16, unsigned short, float, coil_bf16_to_f32, coil_f32_to_bf16, COIL_MAX)
COIL_SORTED_SCATTER(coil_scatter_sorted_amin_f32, float, float, COIL_SAME, COIL_SAME, COIL_MIN)
COIL_SORTED_SCATTER(coil_scatter_sorted_amin_f64, double, double, COIL_SAME, COIL_SAME, COIL_MIN)
COIL_SORTED_SCATTER(coil_scatter_sorted_amin_f16, unsigned short, float, coil_f16_to_f32, coil_f32_to_f16, COIL_MIN)
COIL_SORTED_SCATTER(coil_scatter_sorted_amin_bf16, unsigned short, float, coil_bf16_to_f32, coil_f32_to_bf16, COIL_MIN)
