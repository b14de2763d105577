struct CoilDims { long long size[8]; long long stride[8]; };
#define COIL_GATHER(NAME, T)                                                                  \
extern "C" __global__ void NAME(const T* __restrict__ src, T* __restrict__ dst, long long n,   \
                                int ndim, CoilDims d) {                                        \
    if (n < 2147483648LL) { /* 32-bit divisions: several times cheaper than 64-bit ones */   \
        for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < (unsigned)n;             \
             i += gridDim.x * blockDim.x) {                                                    \
            unsigned rem = i;                                                                  \
            long long off = 0;                                                                 \
            for (int k = ndim - 1; k >= 0; --k) {                                              \
                unsigned s = (unsigned)d.size[k], q = rem / s;                                 \
                off += (long long)(rem - q * s) * d.stride[k];                                 \
                rem = q;                                                                       \
            }                                                                                  \
            dst[i] = src[off];                                                                 \
        }                                                                                      \
        return;                                                                                \
    }                                                                                          \
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;                \
         i += (long long)gridDim.x * blockDim.x) {                                             \
        long long rem = i, off = 0;                                                            \
        for (int k = ndim - 1; k >= 0; --k) {                                                  \
            long long q = rem / d.size[k];                                                     \
            off += (rem - q * d.size[k]) * d.stride[k];                                        \
            rem = q;                                                                           \
        }                                                                                      \
        dst[i] = src[off];                                                                     \
    }                                                                                          \
}
COIL_GATHER(coil_gather_1, unsigned char)
COIL_GATHER(coil_gather_2, unsigned short)
COIL_GATHER(coil_gather_4, unsigned int)
COIL_GATHER(coil_gather_8, unsigned long long)

/* Up to COIL_COPY_BATCH small device-to-device copies in one launch (the inputs a replayed CUDA
   graph reads from its own buffers): block b copies entry b, in 8-byte words where both ends
   are 8-byte aligned, else byte by byte. */
#define COIL_COPY_BATCH 8
struct CoilCopyBatch {
    unsigned long long dst[COIL_COPY_BATCH];
    unsigned long long src[COIL_COPY_BATCH];
    long long bytes[COIL_COPY_BATCH];
};
extern "C" __global__ void coil_copy_batch(CoilCopyBatch c) {
    unsigned char *d = (unsigned char *)c.dst[blockIdx.x];
    const unsigned char *s = (const unsigned char *)c.src[blockIdx.x];
    const long long n = c.bytes[blockIdx.x];
    long long done = 0;
    if (((c.dst[blockIdx.x] | c.src[blockIdx.x]) & 7) == 0) {
        const long long words = n / 8;
        for (long long i = threadIdx.x; i < words; i += blockDim.x)
            ((unsigned long long *)d)[i] = ((const unsigned long long *)s)[i];
        done = words * 8;
    }
    for (long long i = done + threadIdx.x; i < n; i += blockDim.x) d[i] = s[i];
}
