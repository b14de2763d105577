/* Built-in kernels of the fallback ops (see codegen/src/templates/fallback.rs): scatter per
   element size, scatter with a reduction of integers (add, prod, amax, amin) per dtype, and
   cumsum per dtype. Follows half.cuh and scatter.cu (the scatter dims, COIL_SAME, COIL_MUL);
   float reductions are scatter.cu's. */
/* An integer product by compare-and-swap on its own word (wrapping: any order gives the same
   bits). */
#define COIL_RMW_MUL(NAME, WORD)                                                                \
__device__ __forceinline__ void NAME(WORD *p, WORD v) {                                        \
    WORD old = *p, assumed;                                                                    \
    do {                                                                                       \
        assumed = old;                                                                         \
        old = atomicCAS(p, assumed, COIL_MUL(assumed, v));                                     \
    } while (old != assumed);                                                                  \
}
COIL_RMW_MUL(coil_prod_i32, unsigned)
COIL_RMW_MUL(coil_prod_i64, unsigned long long)
#define COIL_SCATTER(NAME, T, UPDATE)                                                         \
extern "C" __global__ void NAME(T *out, const long long *__restrict__ index,                   \
                                const T *__restrict__ src, long long n, int ndim, int dim,    \
                                long long dim_size, CoilScatterDims d, long long *status) {   \
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;                \
         i += (long long)gridDim.x * blockDim.x) {                                             \
        long long rem = i, xo = 0, so = 0;                                                     \
        for (int k = ndim - 1; k >= 0; --k) {                                                  \
            const long long q = rem / d.size[k], c = rem - q * d.size[k];                      \
            rem = q;                                                                           \
            so += c * d.sstride[k];                                                            \
            if (k != dim) xo += c * d.xstride[k];                                              \
        }                                                                                      \
        const long long j = index[i];                                                          \
        if (j < 0 || j >= dim_size) {                                                          \
            if (status[0] == 0) { status[0] = 1; status[1] = j; status[2] = dim_size; }        \
            continue;                                                                          \
        }                                                                                      \
        T *p = out + xo + j * d.xstride[dim];                                                  \
        UPDATE;                                                                                \
    }                                                                                          \
}
COIL_SCATTER(coil_scatter_1, unsigned char, *p = src[so])
COIL_SCATTER(coil_scatter_2, unsigned short, *p = src[so])
COIL_SCATTER(coil_scatter_4, unsigned int, *p = src[so])
COIL_SCATTER(coil_scatter_8, unsigned long long, *p = src[so])
COIL_SCATTER(coil_scatter_add_i32, int, atomicAdd(p, src[so]))
COIL_SCATTER(coil_scatter_add_i64, unsigned long long, atomicAdd(p, src[so]))
COIL_SCATTER(coil_scatter_prod_i32, unsigned, coil_prod_i32(p, src[so]))
COIL_SCATTER(coil_scatter_prod_i64, unsigned long long, coil_prod_i64(p, src[so]))
COIL_SCATTER(coil_scatter_amax_i32, int, atomicMax(p, src[so]))
COIL_SCATTER(coil_scatter_amax_i64, long long, atomicMax(p, src[so]))
COIL_SCATTER(coil_scatter_amin_i32, int, atomicMin(p, src[so]))
COIL_SCATTER(coil_scatter_amin_i64, long long, atomicMin(p, src[so]))
#define COIL_CUMSUM(NAME, T, ACC, LOAD, STORE)                                                 \
extern "C" __global__ void NAME(const T *__restrict__ x, T *__restrict__ y, long long lines,     \
                                long long len, long long inner) {                               \
    for (long long l = blockIdx.x * (long long)blockDim.x + threadIdx.x; l < lines;              \
         l += (long long)gridDim.x * blockDim.x) {                                              \
        const long long o = l / inner, base = o * len * inner + (l - o * inner);                \
        ACC acc = 0;                                                                            \
        for (long long j = 0; j < len; j++) {                                                   \
            acc += LOAD(x[base + j * inner]);                                                   \
            y[base + j * inner] = STORE(acc);                                                   \
        }                                                                                       \
    }                                                                                           \
}
#define COIL_TO_F32(v) ((float)(v))
#define COIL_H2D(v) ((double)coil_f16_to_f32(v))
#define COIL_D2H(v) coil_f32_to_f16((float)(v))
#define COIL_B2D(v) ((double)coil_bf16_to_f32(v))
#define COIL_D2B(v) coil_f32_to_bf16((float)(v))
COIL_CUMSUM(coil_cumsum_f32, float, double, COIL_SAME, COIL_TO_F32)
COIL_CUMSUM(coil_cumsum_f64, double, double, COIL_SAME, COIL_SAME)
COIL_CUMSUM(coil_cumsum_i64, unsigned long long, unsigned long long, COIL_SAME, COIL_SAME)
COIL_CUMSUM(coil_cumsum_f16, unsigned short, double, COIL_H2D, COIL_D2H)
COIL_CUMSUM(coil_cumsum_bf16, unsigned short, double, COIL_B2D, COIL_D2B)
