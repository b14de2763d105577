/* Dropout on the attention weights (coil_ir::op::AttentionDropout), shared by the forward and
   the backward kernels. Follows philox.cuh. Weight `index` (flat, row-major over the
   [*batch, l, s] probabilities: (batch index * l + row) * s + key) is kept iff the top 24 bits
   of Philox word 0 at key `seed`, counter `start + index` reach `threshold`
   (coil_ir::philox::dropout_threshold): Op::Dropout's decision for its element `index`, so the
   kernels keep exactly what the reference decomposition keeps. threshold 0: no dropout. */
struct CoilAttnDropout {
    unsigned long long seed;  /* the stream's key */
    unsigned long long start; /* the counter of weight 0: the stream's offset plus the op's */
    unsigned int threshold;   /* kept iff (w0 >> 8) >= threshold; 0: no dropout */
    float scale;              /* 1 / (1 - p), on kept weights */
};

COIL_D bool coil_drop_keeps(const CoilAttnDropout &d, long long index) {
    uint32_t w[4];
    coil_philox(d.seed, d.start + (unsigned long long)index, w);
    return (w[0] >> 8) >= d.threshold;
}
/* x (a weight, or dO . v_j in the backward) as dropout leaves it: scaled when weight `index`
   is kept, 0 when it is dropped; x itself without dropout. */
COIL_D float coil_dropped(const CoilAttnDropout &d, long long index, float x) {
    if (!d.threshold) return x;
    return coil_drop_keeps(d, index) ? x * d.scale : 0.f;
}
/* The flat index of weight (row, key) of batch index blockIdx.x. */
COIL_D long long coil_drop_index(int l, int s, int row, int key) {
    return ((long long)blockIdx.x * l + row) * s + key;
}
