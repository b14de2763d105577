/* Built-in kernels of the fallback ops (see codegen/src/templates/fallback.rs): scatter per
   element size, scatter with a reduction (add, prod, amax, amin) per dtype, and cumsum per
   dtype. Follows half.cuh. */
struct CoilScatterDims { long long size[8]; long long xstride[8]; long long sstride[8]; };
#define COIL_SAME(v) (v)
/* How scatter_reduce combines the stored value a with a source value b: max and min
   propagate NaN and keep the stored value on a tie (PyTorch's kernels). */
#define COIL_ADDF(a, b) ((a) + (b))
#define COIL_MULF(a, b) ((a) * (b))
#define COIL_MAXF(a, b) ((a) != (a) ? (a) : ((b) != (b) || (b) > (a)) ? (b) : (a))
#define COIL_MINF(a, b) ((a) != (a) ? (a) : ((b) != (b) || (b) < (a)) ? (b) : (a))
/* A 16-bit float update by compare-and-swap on the aligned 32-bit word that holds it (the
   f32 result of two 16-bit values is exact for these combines, so it rounds once). */
#define COIL_RMW16(NAME, TOF, FROMF, COMBINE)                                                   \
__device__ __forceinline__ void NAME(unsigned short *p, unsigned short v) {                    \
    unsigned *w = (unsigned *)((unsigned long long)p & ~3ULL);                                 \
    const unsigned shift = ((unsigned long long)p & 2) ? 16 : 0;                               \
    unsigned old = *w, assumed;                                                                \
    do {                                                                                       \
        assumed = old;                                                                         \
        const unsigned short r = FROMF(COMBINE(TOF((unsigned short)(assumed >> shift)), TOF(v))); \
        const unsigned next = (assumed & ~(0xffffu << shift)) | ((unsigned)r << shift);        \
        old = atomicCAS(w, assumed, next);                                                     \
    } while (old != assumed);                                                                  \
}
COIL_RMW16(coil_add_f16, coil_f16_to_f32, coil_f32_to_f16, COIL_ADDF)
COIL_RMW16(coil_add_bf16, coil_bf16_to_f32, coil_f32_to_bf16, COIL_ADDF)
COIL_RMW16(coil_prod_f16, coil_f16_to_f32, coil_f32_to_f16, COIL_MULF)
COIL_RMW16(coil_prod_bf16, coil_bf16_to_f32, coil_f32_to_bf16, COIL_MULF)
COIL_RMW16(coil_amax_f16, coil_f16_to_f32, coil_f32_to_f16, COIL_MAXF)
COIL_RMW16(coil_amax_bf16, coil_bf16_to_f32, coil_f32_to_bf16, COIL_MAXF)
COIL_RMW16(coil_amin_f16, coil_f16_to_f32, coil_f32_to_f16, COIL_MINF)
COIL_RMW16(coil_amin_bf16, coil_bf16_to_f32, coil_f32_to_bf16, COIL_MINF)
/* A 32- or 64-bit update by compare-and-swap on its own word: WORD the word type, TOV/FROMV
   its conversions to and from the value type V. */
#define COIL_RMW(NAME, V, WORD, TOV, FROMV, COMBINE)                                            \
__device__ __forceinline__ void NAME(V *p, V v) {                                              \
    WORD *w = (WORD *)p;                                                                       \
    WORD old = *w, assumed;                                                                    \
    do {                                                                                       \
        assumed = old;                                                                         \
        old = atomicCAS(w, assumed, FROMV(COMBINE(TOV(assumed), v)));                          \
    } while (old != assumed);                                                                  \
}
#define COIL_U2F(w) __uint_as_float(w)
#define COIL_F2U(f) __float_as_uint(f)
#define COIL_U2D(w) __longlong_as_double((long long)(w))
#define COIL_D2U(d) ((unsigned long long)__double_as_longlong(d))
COIL_RMW(coil_prod_f32, float, unsigned, COIL_U2F, COIL_F2U, COIL_MULF)
COIL_RMW(coil_amax_f32, float, unsigned, COIL_U2F, COIL_F2U, COIL_MAXF)
COIL_RMW(coil_amin_f32, float, unsigned, COIL_U2F, COIL_F2U, COIL_MINF)
COIL_RMW(coil_prod_f64, double, unsigned long long, COIL_U2D, COIL_D2U, COIL_MULF)
COIL_RMW(coil_amax_f64, double, unsigned long long, COIL_U2D, COIL_D2U, COIL_MAXF)
COIL_RMW(coil_amin_f64, double, unsigned long long, COIL_U2D, COIL_D2U, COIL_MINF)
COIL_RMW(coil_prod_i32, unsigned, unsigned, COIL_SAME, COIL_SAME, COIL_MULF)
COIL_RMW(coil_prod_i64, unsigned long long, unsigned long long, COIL_SAME, COIL_SAME, COIL_MULF)
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
COIL_SCATTER(coil_scatter_add_f32, float, atomicAdd(p, src[so]))
COIL_SCATTER(coil_scatter_add_f64, double, atomicAdd(p, src[so]))
COIL_SCATTER(coil_scatter_add_i32, int, atomicAdd(p, src[so]))
COIL_SCATTER(coil_scatter_add_i64, unsigned long long, atomicAdd(p, src[so]))
COIL_SCATTER(coil_scatter_add_f16, unsigned short, coil_add_f16(p, src[so]))
COIL_SCATTER(coil_scatter_add_bf16, unsigned short, coil_add_bf16(p, src[so]))
COIL_SCATTER(coil_scatter_prod_f32, float, coil_prod_f32(p, src[so]))
COIL_SCATTER(coil_scatter_prod_f64, double, coil_prod_f64(p, src[so]))
COIL_SCATTER(coil_scatter_prod_i32, unsigned, coil_prod_i32(p, src[so]))
COIL_SCATTER(coil_scatter_prod_i64, unsigned long long, coil_prod_i64(p, src[so]))
COIL_SCATTER(coil_scatter_prod_f16, unsigned short, coil_prod_f16(p, src[so]))
COIL_SCATTER(coil_scatter_prod_bf16, unsigned short, coil_prod_bf16(p, src[so]))
COIL_SCATTER(coil_scatter_amax_f32, float, coil_amax_f32(p, src[so]))
COIL_SCATTER(coil_scatter_amax_f64, double, coil_amax_f64(p, src[so]))
COIL_SCATTER(coil_scatter_amax_i32, int, atomicMax(p, src[so]))
COIL_SCATTER(coil_scatter_amax_i64, long long, atomicMax(p, src[so]))
COIL_SCATTER(coil_scatter_amax_f16, unsigned short, coil_amax_f16(p, src[so]))
COIL_SCATTER(coil_scatter_amax_bf16, unsigned short, coil_amax_bf16(p, src[so]))
COIL_SCATTER(coil_scatter_amin_f32, float, coil_amin_f32(p, src[so]))
COIL_SCATTER(coil_scatter_amin_f64, double, coil_amin_f64(p, src[so]))
COIL_SCATTER(coil_scatter_amin_i32, int, atomicMin(p, src[so]))
COIL_SCATTER(coil_scatter_amin_i64, long long, atomicMin(p, src[so]))
COIL_SCATTER(coil_scatter_amin_f16, unsigned short, coil_amin_f16(p, src[so]))
COIL_SCATTER(coil_scatter_amin_bf16, unsigned short, coil_amin_bf16(p, src[so]))
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
