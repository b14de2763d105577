/* argsort along one dim: the stable sorting positions of each line, as int64.
 *
 * Every element becomes a (key, position) pair: the key an unsigned integer ordered as PyTorch
 * orders the values (NaN above everything, -0.0 equal to 0.0; complemented for descending), the
 * position its place in the line. Pairs are distinct, so sorting them by (key, position) gives
 * the one stable order with any algorithm.
 *
 *  1. coil_sort_tile_<dtype>: a block per tile of up to COIL_SORT_TILE elements of one line,
 *     a bitonic sort of the tile's pairs in shared memory (padded to a power of two `width`
 *     with pairs larger than any real one). A line of one tile is done: its positions are
 *     written to the output. Longer lines write their sorted tiles to scratch memory.
 *  2. coil_sort_merge: one thread per element merges runs of `width` sorted pairs two by two:
 *     an element's place in the merged run is its place in its own run plus the number of
 *     pairs of the other run below it (a binary search). Passes double `width` until one run
 *     covers the line; the last writes the positions to the output.
 *
 * Lines are `len` elements `inner` apart in the input and the output (the dim's stride);
 * scratch memory holds each line contiguously. No headers: NVRTC compiles this as is; with
 * COIL_SORT_EMULATED defined, the includer provides the CUDA built-ins (the runtime's host
 * emulation test). */

#define COIL_SORT_TILE 2048
typedef unsigned long long coil_u64;

/* Keys: 16-, 32- and 64-bit floats from their bits (sign-magnitude to an unsigned order), so
 * no float conversion is needed; integers by flipping the sign bit. */
#define COIL_FLOAT_KEY(NAME, U, BITS, EXP_MASK)                                              \
__device__ __forceinline__ coil_u64 NAME(U u) {                                              \
    const U sign = (U)1 << (BITS - 1);                                                       \
    const U mag = u & (U)(sign - 1);                                                         \
    if (mag > (U)EXP_MASK) return ~0ULL; /* NaN: above every number */                       \
    if (mag == 0) u = 0;                 /* -0.0 is 0.0 */                                   \
    return (coil_u64)((u & sign) ? (U)~u : (U)(u | sign));                                   \
}
COIL_FLOAT_KEY(coil_key_f16, unsigned short, 16, 0x7c00u)
COIL_FLOAT_KEY(coil_key_bf16, unsigned short, 16, 0x7f80u)
COIL_FLOAT_KEY(coil_key_f32, unsigned int, 32, 0x7f800000u)
COIL_FLOAT_KEY(coil_key_f64, coil_u64, 64, 0x7ff0000000000000ull)
__device__ __forceinline__ coil_u64 coil_key_int(long long v) { return (coil_u64)v ^ (1ULL << 63); }
__device__ __forceinline__ coil_u64 coil_key_i64(long long v) { return coil_key_int(v); }
__device__ __forceinline__ coil_u64 coil_key_i32(int v) { return coil_key_int(v); }
__device__ __forceinline__ coil_u64 coil_key_i16(short v) { return coil_key_int(v); }
__device__ __forceinline__ coil_u64 coil_key_i8(signed char v) { return coil_key_int(v); }
__device__ __forceinline__ coil_u64 coil_key_u8(unsigned char v) { return coil_key_int(v); }

/* (key, position) order. */
__device__ __forceinline__ bool coil_pair_less(coil_u64 ka, unsigned ia, coil_u64 kb, unsigned ib) {
    return ka < kb || (ka == kb && ia < ib);
}

/* Tiles of `lines * tiles` in all, a block each (a grid-stride loop over them). */
#define COIL_SORT_TILE_KERNEL(NAME, T, KEY)                                                      \
extern "C" __global__ void NAME(const T *__restrict__ x, coil_u64 *__restrict__ keys,            \
                                unsigned *__restrict__ pos, long long *__restrict__ out,         \
                                long long lines, long long len, long long inner,                 \
                                long long tiles, int width, int descending) {                    \
    __shared__ coil_u64 sk[COIL_SORT_TILE];                                                      \
    __shared__ unsigned sp[COIL_SORT_TILE];                                                      \
    const coil_u64 flip = descending ? ~0ULL : 0ULL;                                             \
    for (long long b = blockIdx.x; b < lines * tiles; b += gridDim.x) {                          \
        const long long line = b / tiles, start = (b - line * tiles) * COIL_SORT_TILE;          \
        const long long o = line / inner, in = line - o * inner;                                 \
        const long long first = o * len * inner + in; /* element 0 of the line */               \
        const long long rest = len - start;                                                      \
        const int n = rest < width ? (int)rest : width;                                          \
        for (int t = threadIdx.x; t < width; t += blockDim.x) {                                  \
            if (t < n) {                                                                         \
                sk[t] = KEY(x[first + (start + t) * inner]) ^ flip;                              \
                sp[t] = (unsigned)(start + t);                                                   \
            } else {                                                                             \
                sk[t] = ~0ULL;                                                                   \
                sp[t] = ~0u;                                                                     \
            }                                                                                    \
        }                                                                                        \
        __syncthreads();                                                                         \
        for (int k = 2; k <= width; k <<= 1) {                                                   \
            for (int j = k >> 1; j > 0; j >>= 1) {                                               \
                for (int t = threadIdx.x; t < width; t += blockDim.x) {                          \
                    const int u = t ^ j;                                                         \
                    if (u > t) {                                                                 \
                        const bool up = (t & k) == 0;                                            \
                        const bool swap = up ? coil_pair_less(sk[u], sp[u], sk[t], sp[t])        \
                                             : coil_pair_less(sk[t], sp[t], sk[u], sp[u]);       \
                        if (swap) {                                                              \
                            const coil_u64 kk = sk[t]; sk[t] = sk[u]; sk[u] = kk;                \
                            const unsigned pp = sp[t]; sp[t] = sp[u]; sp[u] = pp;                \
                        }                                                                        \
                    }                                                                            \
                }                                                                                \
                __syncthreads();                                                                 \
            }                                                                                    \
        }                                                                                        \
        for (int t = threadIdx.x; t < n; t += blockDim.x) {                                      \
            if (tiles == 1) {                                                                    \
                out[first + (long long)t * inner] = (long long)sp[t];                            \
            } else {                                                                             \
                keys[line * len + start + t] = sk[t];                                            \
                pos[line * len + start + t] = sp[t];                                             \
            }                                                                                    \
        }                                                                                        \
        __syncthreads(); /* the next tile reuses the shared arrays */                           \
    }                                                                                            \
}
COIL_SORT_TILE_KERNEL(coil_sort_tile_f16, unsigned short, coil_key_f16)
COIL_SORT_TILE_KERNEL(coil_sort_tile_bf16, unsigned short, coil_key_bf16)
COIL_SORT_TILE_KERNEL(coil_sort_tile_f32, unsigned int, coil_key_f32)
COIL_SORT_TILE_KERNEL(coil_sort_tile_f64, coil_u64, coil_key_f64)
COIL_SORT_TILE_KERNEL(coil_sort_tile_i64, long long, coil_key_i64)
COIL_SORT_TILE_KERNEL(coil_sort_tile_i32, int, coil_key_i32)
COIL_SORT_TILE_KERNEL(coil_sort_tile_i16, short, coil_key_i16)
COIL_SORT_TILE_KERNEL(coil_sort_tile_i8, signed char, coil_key_i8)
COIL_SORT_TILE_KERNEL(coil_sort_tile_u8, unsigned char, coil_key_u8)

/* One merge pass over every line: runs [2r * width, (2r + 1) * width) and the next one merge
 * into [2r * width, (2r + 2) * width) (the last run of a line may be short or alone). With
 * `last`, the merged positions go to `out` at the line's stride instead of to scratch. */
extern "C" __global__ void coil_sort_merge(const coil_u64 *__restrict__ keys, const unsigned *__restrict__ pos,
                                           coil_u64 *__restrict__ keys_out, unsigned *__restrict__ pos_out,
                                           long long *__restrict__ out, long long lines, long long len,
                                           long long inner, long long width, int last) {
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < lines * len;
         e += (long long)gridDim.x * blockDim.x) {
        const long long line = e / len, p = e - line * len;
        const long long run = p / width, pair = (run >> 1) * 2 * width;
        /* The other run: the next one for an even run, the previous one for an odd run. */
        const long long other = (run & 1) ? pair : pair + width;
        const long long other_end = other + width < len ? other + width : len;
        const long long own_start = run * width;
        const coil_u64 k = keys[e];
        const unsigned i = pos[e];
        const coil_u64 *ok = keys + line * len;
        const unsigned *op = pos + line * len;
        /* Pairs of the other run below (k, i): a lower bound in [other, other_end). */
        long long lo = other, hi = other < other_end ? other_end : other;
        while (lo < hi) {
            const long long mid = lo + ((hi - lo) >> 1);
            if (coil_pair_less(ok[mid], op[mid], k, i)) lo = mid + 1; else hi = mid;
        }
        const long long at = pair + (p - own_start) + (lo - other);
        if (last) {
            const long long o = line / inner, in = line - o * inner;
            out[o * len * inner + in + at * inner] = (long long)i;
        } else {
            keys_out[line * len + at] = k;
            pos_out[line * len + at] = i;
        }
    }
}
