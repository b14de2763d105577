/* Dropout on the attention weights (coil_ir::op::AttentionDropout), shared by the forward and
   the backward kernels. Follows philox.cuh. Weight `index` (flat, row-major over the
   [*batch, l, s] probabilities: (batch index * l + row) * s + key) is kept iff the top 24 bits
   of the uniform word of counter `start + index` (coil_uniform_word) reach `threshold`
   (coil_ir::philox::dropout_threshold): Op::Dropout's decision for its element `index`, so the
   kernels keep exactly what the reference decomposition keeps. threshold 0: no dropout.

   Speed: Philox costs about 100 integer instructions, as much as the rest of a weight's work.
   When `start` and `s` are multiples of 4 (the stream's earlier draws took multiples of 4), the keys
   4m .. 4m + 3 of a row are the words of one uniform block: the lanes of a warp that hold them
   draw the block once (coil_drop_block_bits) and exchange the bits by shuffles. */
struct CoilAttnDropout {
    unsigned long long seed;  /* the stream's key */
    unsigned long long start; /* the counter of weight 0: the stream's offset plus the op's */
    unsigned int threshold;   /* kept iff (word >> 8) >= threshold; 0: no dropout */
    float scale;              /* 1 / (1 - p), on kept weights */
};

COIL_D bool coil_drop_keeps(const CoilAttnDropout &d, long long index) {
    return (coil_uniform_word(d.seed, d.start + (unsigned long long)index) >> 8) >= d.threshold;
}
/* x (a weight, or dO . v_j in the backward) as dropout leaves it: scaled when weight `index`
   is kept, 0 when it is dropped; x itself without dropout. */
COIL_D float coil_dropped(const CoilAttnDropout &d, long long index, float x) {
    if (!d.threshold) return x;
    return coil_drop_keeps(d, index) ? x * d.scale : 0.f;
}
/* x as dropout leaves it, given its keep bit. */
COIL_D float coil_kept_or_zero(const CoilAttnDropout &d, coil_u32 kept, float x) { return kept ? x * d.scale : 0.f; }
/* The flat index of weight (row, key) of batch index blockIdx.x. */
COIL_D long long coil_drop_index(int l, int s, int row, int key) {
    return ((long long)blockIdx.x * l + row) * s + key;
}
/* Whether the keys 4m .. 4m + 3 of every row are one uniform block. */
COIL_D bool coil_drop_in_blocks(const CoilAttnDropout &d, int s) { return ((d.start | (unsigned long long)s) & 3) == 0; }
/* Under coil_drop_in_blocks: the keep bits of keys key4 .. key4 + 3 (key4 a multiple of 4) of
   `row`, bit i for key key4 + i; one Philox for the four. */
COIL_D coil_u32 coil_drop_block_bits(const CoilAttnDropout &d, int l, int s, int row, int key4) {
    uint32_t w[4];
    coil_philox(d.seed, (d.start + (unsigned long long)coil_drop_index(l, s, row, key4)) >> 2, 1u, w);
    coil_u32 bits = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) bits |= (coil_u32)((w[i] >> 8) >= d.threshold) << i;
    return bits;
}

/* The keep bits of a lane's m16n8 accumulator fragments x[j][e] (j < JT <= 8): bit j * 4 + e
   for weight (row + (e >> 1) * 8, key + j * 8 + (e & 1)), where `key` is a multiple of 8 plus
   2t (t = lane % 4). Rows and keys past the ends count as kept (their weights are 0). Every
   lane of the warp calls it (the fast path shuffles). In blocks, lanes t and t ^ 1 hold the
   four keys key & ~3 .. + 3 of rows `row` and `row + 8`: lane t draws them for row
   row + 8 (t & 1) and the pair swaps its draws. */
template <int JT> COIL_D coil_u32 coil_drop_frag_bits(const CoilAttnDropout &d, int l, int s, int row, int key) {
    coil_u32 bits = 0;
    if (coil_drop_in_blocks(d, s)) {
        const int half = (key >> 1) & 1; /* t & 1 */
        coil_u32 mine = 0;
#pragma unroll
        for (int j = 0; j < JT; ++j) mine |= coil_drop_block_bits(d, l, s, row + 8 * half, (key & ~3) + j * 8) << (4 * j);
        const coil_u32 other = coil_shfl_u32(mine, (threadIdx.x & 31) ^ 1);
#pragma unroll
        for (int j = 0; j < JT; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const coil_u32 word = (e >> 1) == half ? mine : other;
                bits |= ((word >> (4 * j + 2 * half + (e & 1))) & 1u) << (j * 4 + e);
            }
        }
    } else {
#pragma unroll
        for (int j = 0; j < JT; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e)
                bits |= (coil_u32)coil_drop_keeps(d, coil_drop_index(l, s, row + (e >> 1) * 8, key + j * 8 + (e & 1))) << (j * 4 + e);
        }
    }
    if (row + 16 > l || key + 8 * JT > s) { /* past the ends: kept */
#pragma unroll
        for (int j = 0; j < JT; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e)
                if (row + (e >> 1) * 8 >= l || key + j * 8 + (e & 1) >= s) bits |= 1u << (j * 4 + e);
        }
    }
    return bits;
}

/* The keep bits of a lane's transposed fragments (the backward's dK, dV blocks, 8 of them):
   bit j * 4 + e for weight (row + j * 8 + (e & 1), key + (e >> 1) * 8), where `row` is a
   multiple of 8 plus 2t and `key` a multiple of 4 plus g % 4 (g = lane / 4). Rows and keys
   past the ends count as kept. Every lane of the warp calls it. In blocks, the four lanes of
   one t whose g differ in the low two bits hold keys key & ~3 .. + 3 and key & ~3 + 8 .. + 11
   of rows row + j * 8 and row + j * 8 + 1: lane g draws the combination e = g % 4 (row
   + (e & 1), keys + (e >> 1) * 8) and the four swap their draws. */
COIL_D coil_u32 coil_drop_frag_bits_t(const CoilAttnDropout &d, int l, int s, int row, int key) {
    coil_u32 bits = 0;
    if (coil_drop_in_blocks(d, s)) {
        const int mine_e = key & 3, key4 = key & ~3;
        coil_u32 mine = 0;
#pragma unroll
        for (int j = 0; j < 8; ++j) mine |= coil_drop_block_bits(d, l, s, row + j * 8 + (mine_e & 1), key4 + (mine_e >> 1) * 8) << (4 * j);
        const int lane = threadIdx.x & 31;
        coil_u32 words[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) words[e] = coil_shfl_u32(mine, (lane & ~12) | (e << 2));
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) bits |= ((words[e] >> (4 * j + mine_e)) & 1u) << (j * 4 + e);
        }
    } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e)
                bits |= (coil_u32)coil_drop_keeps(d, coil_drop_index(l, s, row + j * 8 + (e & 1), key + (e >> 1) * 8)) << (j * 4 + e);
        }
    }
    if (row + 64 > l || key + 8 >= s) { /* past the ends: kept */
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e)
                if (row + j * 8 + (e & 1) >= l || key + (e >> 1) * 8 >= s) bits |= 1u << (j * 4 + e);
        }
    }
    return bits;
}
