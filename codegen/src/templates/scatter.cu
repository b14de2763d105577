/* The sorted scatter (see codegen/src/templates/scatter.rs): scatter_add and scatter_reduce of
   floats with each destination's sources combined in the index's order by one thread, no
   atomics, so that the result's bits repeat from run to run and are the reference
   interpreter's. The index's positions are grouped by destination by the argsort template
   (sort.cu, launched between these kernels). Follows half.cuh. No headers: NVRTC compiles this
   as is; the runtime's host emulation test (runtime/src/cuda/scatter_emulation.rs) provides the
   CUDA built-ins and, with COIL_EMULATED, the 16-bit conversions. */
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

/* The offsets in x and src of the coordinates `rem` spreads over the index's dims [first,
   last] (row-major; dim `first` takes the rest, no division), added to xo and so. */
__device__ __forceinline__ void coil_scatter_part(const CoilScatterDims &d, int first, int last, long long rem,
                                                  long long &xo, long long &so) {
    for (int a = last; a >= first; --a) {
        long long c = rem;
        if (a > first) {
            rem = c / d.size[a];
            c -= rem * d.size[a];
        }
        xo += c * d.xstride[a];
        so += c * d.sstride[a];
    }
}

/* The combine, a thread per element: the index seen as [outer * len, inner] (`len` its size
   along the scattered dim), a row being (line o, rank k) in the sorted order and a column i.
   Where rank k starts a run of equal keys in its line, the thread combines x's element at (o,
   key, i) with the sources of the run in the run's order (ascending positions: the sort is
   stable) and stores the result once; other threads have nothing to do. `stride` is 1 where
   the index repeats along its rows (one sort per line serves every column) and `inner`
   otherwise (a sort per column). Blocks are 2-D: x over columns, y over rows, both
   grid-stride. ACC is the type combined in; LOAD widens a T to it, STORE narrows, COMBINE
   combines and rounds to T's precision, as the interpreter rounds each step. */
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
            long long xo = key * d.xstride[dim], so = 0;                                             \
            coil_scatter_part(d, dim + 1, ndim - 1, i, xo, so);                                      \
            coil_scatter_part(d, 0, dim - 1, o, xo, so);                                             \
            T *p = out + xo;                                                                         \
            const T *s = src + so;                                                                   \
            const long long step = d.sstride[dim];                                                   \
            ACC acc = LOAD(*p);                                                                      \
            for (long long q = k;; q += COIL_SCATTER_BATCH) {                                        \
                /* The run's next sources: keys and positions (a run is contiguous), then their     \
                   values, all loads in flight before the combines. */                               \
                long long at[COIL_SCATTER_BATCH];                                                    \
                _Pragma("unroll") for (int u = 0; u < COIL_SCATTER_BATCH; u++) {                    \
                    const long long r = q + u, e = line + r * stride;                                \
                    const bool in = r < len;                                                         \
                    const long long position = in ? pos[e] : 0;                                      \
                    at[u] = in && sorted[e] == key ? position : -1;                                  \
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

/* Most threads of a rows block, and the run positions it stages at a time. */
#define COIL_SCATTER_ROWS_BLOCK 256
/* 16 bytes of a row: what a rows thread loads and stores at once. */
struct alignas(16) CoilVec16 { unsigned x, y, z, w; };

/* The combine of a rows scatter (`stride` 1) whose rows are whole 16-byte vectors (V
   elements; the runtime checks the sizes and alignments): a block per rank (grid-stride along
   y), a thread per vector of columns (x, every one covered: a thread keeps its columns). The
   block stages the run's keys and positions in shared memory, 32 at first (with the previous
   rank's key: whether this rank starts a run), then the block's width at a time; where the
   rank starts a run each thread combines its V columns over the staged rows in order,
   COIL_SCATTER_BATCH rows' loads in flight at once, and stores them once. */
#define COIL_ROWS_SCATTER(NAME, T, V, ACC, LOAD, STORE, COMBINE)                                   \
union NAME##_vec { CoilVec16 raw; T t[V]; };                                                         \
extern "C" __global__ void __launch_bounds__(COIL_SCATTER_ROWS_BLOCK)                                \
NAME(T *out, const T *__restrict__ src, const long long *__restrict__ pos,                           \
     const long long *__restrict__ sorted, int ndim, int dim, long long outer, long long len,        \
     long long inner, long long dim_size, CoilScatterDims d) {                                       \
    __shared__ long long run[COIL_SCATTER_ROWS_BLOCK];                                               \
    __shared__ long long run_keys[COIL_SCATTER_ROWS_BLOCK];                                          \
    __shared__ long long prev_key;                                                                   \
    __shared__ int run_len;                                                                          \
    const int t = threadIdx.x;                                                                       \
    const long long i = (blockIdx.x * (long long)blockDim.x + t) * V; /* the thread's columns */     \
    const bool mine = i < inner;                                                                     \
    long long xi = 0, si = 0;                                                                        \
    coil_scatter_part(d, dim + 1, ndim - 1, mine ? i : 0, xi, si);                                   \
    const long long step = d.sstride[dim];                                                           \
    for (long long row = blockIdx.y; row < outer * len; row += gridDim.y) {                         \
        const long long o = outer == 1 ? 0 : row / len, k = row - o * len;                           \
        const long long *keys = sorted + o * len, *line = pos + o * len;                             \
        long long key = 0, q = k;                                                                    \
        T *p = out;                                                                                  \
        const T *s = src;                                                                            \
        ACC acc[V];                                                                                  \
        for (int chunk = 32;; q += chunk, chunk = blockDim.x) {                                      \
            /* Stage the chunk (positions past the line clamped to its last, not counted). */       \
            if (t == 0) run_len = 0;                                                                 \
            if (t < chunk) {                                                                         \
                const long long r = q + t < len ? q + t : len - 1;                                   \
                run_keys[t] = keys[r];                                                               \
                run[t] = line[r];                                                                    \
            }                                                                                        \
            if (q == k && t == 0) prev_key = k > 0 ? keys[k - 1] : ~keys[k];                         \
            __syncthreads();                                                                         \
            if (q == k) {                                                                            \
                key = run_keys[0];                                                                   \
                if (prev_key == key || key < 0 || key >= dim_size) { /* uniform: no run starts */   \
                    __syncthreads(); /* read by all before the next rank is staged */                \
                    break;                                                                           \
                }                                                                                    \
                long long xo = xi + key * d.xstride[dim], so = si;                                   \
                coil_scatter_part(d, 0, dim - 1, o, xo, so);                                         \
                p = out + xo;                                                                        \
                s = src + so;                                                                        \
                if (mine) {                                                                          \
                    NAME##_vec v;                                                                    \
                    v.raw = *(const CoilVec16 *)p;                                                   \
                    _Pragma("unroll") for (int e = 0; e < V; e++) acc[e] = LOAD(v.t[e]);            \
                }                                                                                    \
            }                                                                                        \
            /* The run's rows in the chunk: up to its last equal key (a run is contiguous). */       \
            if (t < chunk && q + t < len && run_keys[t] == key &&                                    \
                (t + 1 == chunk || q + t + 1 >= len || run_keys[t + 1] != key))                      \
                run_len = t + 1;                                                                     \
            __syncthreads();                                                                         \
            const int n = run_len;                                                                   \
            if (mine) {                                                                              \
                for (int b = 0; b < n; b += COIL_SCATTER_BATCH) {                                    \
                    NAME##_vec v[COIL_SCATTER_BATCH];                                                \
                    _Pragma("unroll") for (int u = 0; u < COIL_SCATTER_BATCH; u++)                  \
                        if (b + u < n) v[u].raw = *(const CoilVec16 *)(s + run[b + u] * step);      \
                    _Pragma("unroll") for (int u = 0; u < COIL_SCATTER_BATCH; u++) {                \
                        if (b + u < n) {                                                             \
                            _Pragma("unroll") for (int e = 0; e < V; e++)                           \
                                acc[e] = COMBINE(acc[e], LOAD(v[u].t[e]));                           \
                        }                                                                            \
                    }                                                                                \
                }                                                                                    \
            }                                                                                        \
            __syncthreads(); /* the chunk read by all before the next one is staged */               \
            if (n < chunk) {                                                                         \
                if (mine) {                                                                          \
                    NAME##_vec w;                                                                    \
                    _Pragma("unroll") for (int e = 0; e < V; e++) w.t[e] = STORE(acc[e]);           \
                    *(CoilVec16 *)p = w.raw;                                                         \
                }                                                                                    \
                break;                                                                               \
            }                                                                                        \
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
COIL_ROWS_SCATTER(coil_scatter_rows_add_f32, float, 4, float, COIL_SAME, COIL_SAME, COIL_ADD)
COIL_ROWS_SCATTER(coil_scatter_rows_add_f64, double, 2, double, COIL_SAME, COIL_SAME, COIL_ADD)
COIL_ROWS_SCATTER(coil_scatter_rows_add_f16, unsigned short, 8, float, coil_f16_to_f32, coil_f32_to_f16, COIL_ADD_F16)
COIL_ROWS_SCATTER(coil_scatter_rows_add_bf16, unsigned short, 8, float, coil_bf16_to_f32, coil_f32_to_bf16, COIL_ADD_BF16)
COIL_ROWS_SCATTER(coil_scatter_rows_prod_f32, float, 4, float, COIL_SAME, COIL_SAME, COIL_MUL)
COIL_ROWS_SCATTER(coil_scatter_rows_prod_f64, double, 2, double, COIL_SAME, COIL_SAME, COIL_MUL)
COIL_ROWS_SCATTER(coil_scatter_rows_prod_f16, unsigned short, 8, float, coil_f16_to_f32, coil_f32_to_f16, COIL_MUL_F16)
COIL_ROWS_SCATTER(coil_scatter_rows_prod_bf16, unsigned short, 8, float, coil_bf16_to_f32, coil_f32_to_bf16, COIL_MUL_BF16)
COIL_ROWS_SCATTER(coil_scatter_rows_amax_f32, float, 4, float, COIL_SAME, COIL_SAME, COIL_MAX)
COIL_ROWS_SCATTER(coil_scatter_rows_amax_f64, double, 2, double, COIL_SAME, COIL_SAME, COIL_MAX)
COIL_ROWS_SCATTER(coil_scatter_rows_amax_f16, unsigned short, 8, float, coil_f16_to_f32, coil_f32_to_f16, COIL_MAX)
COIL_ROWS_SCATTER(coil_scatter_rows_amax_bf16, unsigned short, 8, float, coil_bf16_to_f32, coil_f32_to_bf16, COIL_MAX)
COIL_ROWS_SCATTER(coil_scatter_rows_amin_f32, float, 4, float, COIL_SAME, COIL_SAME, COIL_MIN)
COIL_ROWS_SCATTER(coil_scatter_rows_amin_f64, double, 2, double, COIL_SAME, COIL_SAME, COIL_MIN)
COIL_ROWS_SCATTER(coil_scatter_rows_amin_f16, unsigned short, 8, float, coil_f16_to_f32, coil_f32_to_f16, COIL_MIN)
COIL_ROWS_SCATTER(coil_scatter_rows_amin_bf16, unsigned short, 8, float, coil_bf16_to_f32, coil_f32_to_bf16, COIL_MIN)
