/* coil attention template: FlashAttention-2-style backward (see
   codegen/src/templates/attention_backward.rs). Follows attention_common.cuh.

   The grid's y dim has two kinds of blocks. The first key_blocks take 64 keys each and walk the
   query blocks that see them: dV = P^T dO and dK = scale dS^T Q, accumulated on chip. The others
   take 64 query rows each and walk the key blocks they see: dQ = scale dS K. P = exp2(S scale_log2
   - lse log2(e)) is recomputed from the saved logsumexp, dS = P (dO V^T - delta); neither is
   ever stored, and no two blocks write one element (no atomics: results repeat exactly). delta =
   rowsum(dO O) is computed before, by its own kernel (coil_attention_delta). With an explicit
   mask (mask_kind 1 bool, 2 added; read by coil_mask_at, as the forward reads it), S gets the
   mask's term and P is 0 where the mask drops the key: a row that keeps no key (its lse -inf)
   has zero gradients, as PyTorch's. With dropout (CoilAttnDropout, masked or not), dV takes the
   forward's dropped P and dS the dropped dP (attention_dropout.cuh).

   Stored dS (maskless calls wanting dQ and dK or dV; the rule is AttentionBackwardKernel::
   stores_ds): the grid has dK, dV blocks only, which also write dS (rounded to the half type,
   as the products take it) into a workspace, key-major ([batch index][key][row]); then
   coil_attention_bwd_dq_stored computes dQ = scale dS K from it, one product instead of three
   and no second draw of the dropout. Still no atomics. */

struct CoilAttnBwdParams {
    CoilAttnOperand q, k, v, dout, dq, dk, dv;
    int heads;        /* batch indices per outer index: blockIdx.x = b * heads + h */
    int l, s, d;      /* query rows, keys, head dim */
    float scale;      /* the factor on q . k */
    float scale_log2; /* scale * log2(e) */
    int causal;       /* query row i sees keys j <= i (top-left aligned) */
    int key_blocks;   /* blocks (of the grid's y dim) computing dK and dV; the rest compute dQ */
    CoilAttnOperand mask; /* element (b, h, row, key) of the explicit mask; broadcast dims have stride 0 */
    int mask_kind;        /* 0 none; 1 bool (a byte per element, nonzero keeps); 2 added, of the operands' dtype */
    CoilAttnDropout drop; /* the forward's dropout, regenerated (threshold 0: none) */
};

/* The rows of statistics (lse in log2 units, delta) the backward reads, per batch index. */
COIL_D float coil_lse2(const float *lse, int row, int l) {
    return row < l ? lse[(long long)blockIdx.x * l + row] * COIL_LOG2E : 0.f;
}
COIL_D float coil_row_stat(const float *x, int row, int l) { return row < l ? x[(long long)blockIdx.x * l + row] : 0.f; }

/* P of a score `x` (scaled, log2 units) under the mask's term `t` (log2 units) in a row of
   logsumexp `lse2` (log2 units): 0 where the mask drops the key, whose row's lse2 may be -inf
   (a row that keeps no key), so that no inf - inf is taken. */
COIL_D float coil_masked_p(float x, float t, float lse2) { return t == COIL_NEG_INF ? 0.f : coil_exp2(x + t - lse2); }

/* Whether the explicit mask keeps any (row, key) of rows [row0, row0 + 64) and keys [key0, key0 +
   64) (within l and s, and the causal rule): else P is 0 over the tile and a tensor-core block
   skips its products (a padding mask's dead keys). Every one of the block's 128 threads calls
   it (a barrier); the answer is the block's. */
template <int KIND>
COIL_D bool coil_bwd_tile_live(const void *mask, long long mb, const CoilAttnBwdParams &p, int row0, int key0) {
    bool live = false;
    for (int i = threadIdx.x; i < 64 * 64 && !live; i += 128) {
        const int row = row0 + i / 64, key = key0 + i % 64;
        if (row < p.l && key < p.s && !(p.causal && key > row))
            live = coil_mask_at<KIND>(mask, p.mask, p.mask_kind, mb, row, key) != COIL_NEG_INF;
    }
    return __syncthreads_or(live) != 0;
}

#ifndef COIL_EMULATED
/* The sum of x over the warp's 32 lanes, in every lane (left to the includer when emulated). */
COIL_D float coil_warp_sum(float x) {
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) x += __shfl_xor_sync(0xffffffffu, x, m);
    return x;
}
#endif

/* The parameters of the delta kernel: the output and its gradient, [*batch, l, d] views. */
struct CoilAttnDeltaParams {
    CoilAttnOperand o, dout;
    long long rows; /* query rows of every batch index: batch indices x l */
    int heads;      /* inner batch dim's size: batch index x is (x / heads, x % heads) */
    int l, d;       /* query rows per batch index, head dim */
};

/* delta = rowsum(dO O) in f32 of every query row, row-major [*batch, l] (the backward's
   statistic, as FlashAttention's preprocessing computes it): one warp per row, 4 rows per block
   of 128 threads; lane i reads columns i, i + 32, ... of both views through their strides (any
   strides; consecutive lanes read consecutive columns of a unit-stride row). */
template <int KIND>
COIL_D void coil_attention_delta(const void *o, const void *dout, float *delta, const CoilAttnDeltaParams &p) {
    const long long r = (long long)blockIdx.x * 4 + (threadIdx.x >> 5);
    if (r >= p.rows) return; /* the whole warp: no lane of it takes part in the sum */
    const int lane = threadIdx.x & 31;
    const long long bx = r / p.l, row = r - bx * p.l, b = bx / p.heads, h = bx - b * p.heads;
    const long long ob = p.o.offset + b * p.o.outer + h * p.o.inner + row * p.o.row;
    const long long gb = p.dout.offset + b * p.dout.outer + h * p.dout.inner + row * p.dout.row;
    float acc = 0.f;
    for (int c = lane; c < p.d; c += 32)
        acc += coil_att_load<KIND>(o, ob + c * p.o.col) * coil_att_load<KIND>(dout, gb + c * p.dout.col);
    acc = coil_warp_sum(acc);
    if (lane == 0) delta[r] = acc;
}

#ifdef COIL_EMULATED
#define COIL_DYNAMIC_SHARED ((coil_u16 *)coil_emu_dynamic_shared)
#else
/* Dynamic shared memory: four tiles and two rows of statistics (more than 48 KiB at head dim
   96 and up, which the launch allows). */
struct alignas(16) coil_chunk { coil_u32 w[4]; };
extern __shared__ coil_chunk coil_dynamic_shared[];
#define COIL_DYNAMIC_SHARED ((coil_u16 *)coil_dynamic_shared)
#endif

/* Whether a warp holds its 16 rows of the operands that stay fixed through a block's walk (K
   and V for dK, dV; Q and dO for dQ) as A fragments in registers: up to head dim 64. Their
   tiles are then free after the first load, and the walk double-buffers the other two operands
   in them (the next block's copies overlap this block's products). Wider heads keep all four
   tiles and read the fragments again at each step (registers). */
template <int DP> struct CoilHold { static constexpr bool value = DP <= 64; };

/* dK and dV of 64 keys (warp w: keys 16w .. 16w + 15), by the transposed products: the warp
   holds S^T and dP^T (16 keys x 64 query rows) as accumulators, which are A fragments of the
   next products. Tiles (TILE elements each): K, V in 2, 3; Q, dO in 0, 1 (and, holding, the
   next block's Q, dO in 2, 3, alternating). */
template <int DP, bool BF16, bool MASKED>
COIL_D void coil_attention_bwd_dkdv(const coil_u16 *q, const coil_u16 *k, const coil_u16 *v, const coil_u16 *dout,
                                    const float *lse, const float *delta, coil_u16 *dk, coil_u16 *dv,
                                    const void *mask, coil_u16 *ds, const CoilAttnBwdParams &p, int kblock) {
    constexpr int BLOCK = 64, PITCH = DP + 8, KC = DP / 16, NT = DP / 8, TILE = BLOCK * PITCH;
    constexpr bool HOLD = CoilHold<DP>::value;
    coil_u16 *smem = COIL_DYNAMIC_SHARED;
    float *s_lse = (float *)(smem + 4 * TILE), *s_delta = s_lse + BLOCK;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int key0 = kblock * BLOCK;
    const coil_u16 *qb = q + coil_batch_base(p.q, p.heads), *dob = dout + coil_batch_base(p.dout, p.heads);
    /* Compiled without the mask's code unless MASKED (a maskless call pays nothing for it). */
    const int mask_kind = MASKED ? p.mask_kind : 0;
    const long long mb = mask_kind ? coil_batch_base(p.mask, p.heads) : 0;
    /* Query blocks whose rows see a key of this block: all, or (causal) from the diagonal on. */
    const int qblocks = (p.l + BLOCK - 1) / BLOCK, first = p.causal ? kblock : 0;
    coil_tile_load<DP>(smem + 2 * TILE, k + coil_batch_base(p.k, p.heads), p.k.row, key0, p.s, p.d);
    coil_tile_load<DP>(smem + 3 * TILE, v + coil_batch_base(p.v, p.heads), p.v.row, key0, p.s, p.d);
    coil_cp_async_commit();
    if (first < qblocks) {
        coil_tile_load<DP>(smem, qb, p.q.row, first * BLOCK, p.l, p.d);
        coil_tile_load<DP>(smem + TILE, dob, p.dout.row, first * BLOCK, p.l, p.d);
    }
    coil_cp_async_commit();
    coil_u32 kf[HOLD ? KC : 1][4], vf[HOLD ? KC : 1][4];
    if constexpr (HOLD) {
        coil_cp_async_wait<1>(); /* K and V landed */
        __syncthreads();
        coil_a_frags<DP>(smem + 2 * TILE, warp * 16, kf);
        coil_a_frags<DP>(smem + 3 * TILE, warp * 16, vf);
        __syncthreads(); /* every warp holds its K and V: tiles 2, 3 are free */
    }

    float dk_acc[NT][4], dv_acc[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) dk_acc[n][e] = dv_acc[n][e] = 0.f;
    }
    for (int qbi = first, stage = 0; qbi < qblocks; ++qbi, stage ^= 1) {
        const int row0 = qbi * BLOCK;
        coil_u16 *sq = smem + (HOLD ? 2 * stage : 0) * TILE, *sdo = sq + TILE;
        if (HOLD && qbi + 1 < qblocks) {
            coil_u16 *next = smem + 2 * (stage ^ 1) * TILE;
            coil_tile_load<DP>(next, qb, p.q.row, row0 + BLOCK, p.l, p.d);
            coil_tile_load<DP>(next + TILE, dob, p.dout.row, row0 + BLOCK, p.l, p.d);
        } else if (!HOLD && qbi > first) {
            coil_tile_load<DP>(sq, qb, p.q.row, row0, p.l, p.d);
            coil_tile_load<DP>(sdo, dob, p.dout.row, row0, p.l, p.d);
        }
        coil_cp_async_commit(); /* maybe empty: the waits below count alike */
        if (threadIdx.x < BLOCK) {
            s_lse[threadIdx.x] = coil_lse2(lse, row0 + threadIdx.x, p.l);
            s_delta[threadIdx.x] = coil_row_stat(delta, row0 + threadIdx.x, p.l);
        }
        if constexpr (HOLD) {
            coil_cp_async_wait<1>(); /* this block's Q, dO landed (the next block's may not have) */
        } else {
            coil_cp_async_wait<0>();
        }
        __syncthreads();
        /* A tile the mask drops whole adds nothing (the statistics' next writes follow the vote's
           barrier; no thread reads these tiles after it). */
        if (mask_kind && !coil_bwd_tile_live<BF16 ? 2 : 1>(mask, mb, p, row0, key0)) continue;

        /* S^T = K Q^T: this warp's 16 keys x 64 rows; then P^T in place, 0 where masked (rows
           past the end, keys after the row when causal: only in an edge tile, the last query
           block or the diagonal one; the explicit mask's, in every tile). */
        const bool edge = row0 + BLOCK > p.l || (p.causal && key0 + BLOCK - 1 > row0) || mask_kind;
        coil_u32 af[HOLD ? 1 : KC][4];
        float st[8][4], dpt[8][4];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) st[j][e] = dpt[j][e] = 0.f;
        }
        if constexpr (!HOLD) coil_a_frags<DP>(smem + 2 * TILE, warp * 16, af);
        coil_mma_abt<DP, BF16>(st, HOLD ? kf : af, sq);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = j * 8 + 2 * t + (e & 1);
                float x = coil_exp2(st[j][e] * p.scale_log2 - s_lse[i]);
                if (edge) {
                    const int key = key0 + warp * 16 + g + (e >> 1) * 8, row = row0 + i;
                    if (row >= p.l || (p.causal && key > row)) {
                        x = 0.f;
                    } else if (mask_kind) { /* keys past the end (their rows are not stored): P = 0 */
                        const float t = key < p.s ? coil_mask_at<BF16 ? 2 : 1>(mask, p.mask, mask_kind, mb, row, key) : COIL_NEG_INF;
                        x = coil_masked_p(st[j][e] * p.scale_log2, t, s_lse[i]);
                    }
                }
                st[j][e] = x;
            }
        }
        /* With dropout: which of this thread's 32 weights the forward kept (bit j * 4 + e), and
           dV += (P Z / (1 - p))^T dO. */
        const coil_u32 kept = p.drop.threshold ? coil_drop_frag_bits_t(p.drop, p.l, p.s, row0 + 2 * t, key0 + warp * 16 + g) : ~0u;
        if (p.drop.threshold) {
            float pt[8][4];
#pragma unroll
            for (int j = 0; j < 8; ++j) {
#pragma unroll
                for (int e = 0; e < 4; ++e) pt[j][e] = coil_kept_or_zero(p.drop, (kept >> (j * 4 + e)) & 1u, st[j][e]);
            }
            coil_mma_ab<DP, BF16>(dv_acc, pt, sdo);
        } else {
            coil_mma_ab<DP, BF16>(dv_acc, st, sdo); /* dV += P^T dO */
        }
        /* dP^T = V dO^T, then dS^T = P^T (dP^T - delta) in place. */
        if constexpr (!HOLD) coil_a_frags<DP>(smem + 3 * TILE, warp * 16, af);
        coil_mma_abt<DP, BF16>(dpt, HOLD ? vf : af, sdo);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float dp = p.drop.threshold ? coil_kept_or_zero(p.drop, (kept >> (j * 4 + e)) & 1u, dpt[j][e]) : dpt[j][e];
                dpt[j][e] = st[j][e] * (dp - s_delta[j * 8 + 2 * t + (e & 1)]);
            }
        }
        coil_mma_ab<DP, BF16>(dk_acc, dpt, sq); /* dK += dS^T Q (scaled at the end) */
        if (ds) { /* dS^T of this warp's 16 keys x the block's 64 rows, for the dQ kernel */
            const float one[2] = {1.f, 1.f};
            coil_store_rows<64, BF16>(ds + (long long)blockIdx.x * p.s * p.l + row0, p.l, key0 + warp * 16, p.s,
                                      p.l - row0, dpt, one);
        }
        __syncthreads(); /* every warp is done with these tiles and the statistics */
    }
    coil_cp_async_wait<0>(); /* no copy outlives the block (when no query block sees these keys) */
    const float one[2] = {1.f, 1.f}, scale[2] = {p.scale, p.scale};
    const int row = key0 + warp * 16;
    if (dk) coil_store_rows<DP, BF16>(dk + coil_batch_base(p.dk, p.heads), p.dk.row, row, p.s, p.d, dk_acc, scale);
    if (dv) coil_store_rows<DP, BF16>(dv + coil_batch_base(p.dv, p.heads), p.dv.row, row, p.s, p.d, dv_acc, one);
}

/* dQ of 64 query rows (warp w: rows 16w .. 16w + 15). Tiles: Q, dO in 0, 1 (holding: staged
   in 2, 3); K, V in 2, 3 (holding: in 0, 1 and 2, 3, alternating). */
template <int DP, bool BF16, bool MASKED>
COIL_D void coil_attention_bwd_dq(const coil_u16 *q, const coil_u16 *k, const coil_u16 *v, const coil_u16 *dout,
                                  const float *lse, const float *delta, coil_u16 *dq, const void *mask,
                                  const CoilAttnBwdParams &p, int qblock) {
    constexpr int BLOCK = 64, PITCH = DP + 8, KC = DP / 16, NT = DP / 8, TILE = BLOCK * PITCH;
    constexpr bool HOLD = CoilHold<DP>::value;
    coil_u16 *smem = COIL_DYNAMIC_SHARED;
    coil_u16 *sq = smem + (HOLD ? 2 : 0) * TILE, *sdo = sq + TILE;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int row0 = qblock * BLOCK, first = row0 + warp * 16;
    const coil_u16 *kb = k + coil_batch_base(p.k, p.heads), *vb = v + coil_batch_base(p.v, p.heads);
    /* Compiled without the mask's code unless MASKED (a maskless call pays nothing for it). */
    const int mask_kind = MASKED ? p.mask_kind : 0;
    const long long mb = mask_kind ? coil_batch_base(p.mask, p.heads) : 0;
    int kblocks = (p.s + BLOCK - 1) / BLOCK;
    if (p.causal) kblocks = coil_imin(kblocks, qblock + 1);
    coil_tile_load<DP>(sq, q + coil_batch_base(p.q, p.heads), p.q.row, row0, p.l, p.d);
    coil_tile_load<DP>(sdo, dout + coil_batch_base(p.dout, p.heads), p.dout.row, row0, p.l, p.d);
    coil_cp_async_commit();
    coil_tile_load<DP>(smem + (HOLD ? 0 : 2) * TILE, kb, p.k.row, 0, p.s, p.d);
    coil_tile_load<DP>(smem + (HOLD ? 1 : 3) * TILE, vb, p.v.row, 0, p.s, p.d);
    coil_cp_async_commit();
    /* This thread's rows g and g + 8: the logsumexp (log2 units) and delta. */
    const float lse2[2] = {coil_lse2(lse, first + g, p.l), coil_lse2(lse, first + g + 8, p.l)};
    const float dl[2] = {coil_row_stat(delta, first + g, p.l), coil_row_stat(delta, first + g + 8, p.l)};
    coil_u32 qf[HOLD ? KC : 1][4], gf[HOLD ? KC : 1][4];
    if constexpr (HOLD) {
        coil_cp_async_wait<1>(); /* Q and dO landed */
        __syncthreads();
        coil_a_frags<DP>(sq, warp * 16, qf);
        coil_a_frags<DP>(sdo, warp * 16, gf);
        __syncthreads(); /* every warp holds its Q and dO: tiles 2, 3 are free */
    }

    float dq_acc[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) dq_acc[n][0] = dq_acc[n][1] = dq_acc[n][2] = dq_acc[n][3] = 0.f;
    for (int kbi = 0, stage = 0; kbi < kblocks; ++kbi, stage ^= 1) {
        const int key0 = kbi * BLOCK;
        coil_u16 *sk = smem + (HOLD ? 2 * stage : 2) * TILE, *sv = sk + TILE;
        if (HOLD && kbi + 1 < kblocks) {
            coil_u16 *next = smem + 2 * (stage ^ 1) * TILE;
            coil_tile_load<DP>(next, kb, p.k.row, key0 + BLOCK, p.s, p.d);
            coil_tile_load<DP>(next + TILE, vb, p.v.row, key0 + BLOCK, p.s, p.d);
        } else if (!HOLD && kbi > 0) {
            coil_tile_load<DP>(sk, kb, p.k.row, key0, p.s, p.d);
            coil_tile_load<DP>(sv, vb, p.v.row, key0, p.s, p.d);
        }
        coil_cp_async_commit(); /* maybe empty: the waits below count alike */
        if constexpr (HOLD) {
            coil_cp_async_wait<1>(); /* this block's K, V landed (the next block's may not have) */
        } else {
            coil_cp_async_wait<0>();
        }
        __syncthreads();
        /* A tile the mask drops whole for the block's rows adds nothing (no thread reads these
           tiles after the vote's barrier). */
        if (mask_kind && !coil_bwd_tile_live<BF16 ? 2 : 1>(mask, mb, p, row0, key0)) continue;

        /* S = Q K^T and P in place (0 for keys past the end, and after the row when causal);
           dP = dO V^T and dS = P (dP - delta) in place. Masking only in an edge tile: the last
           key block, or the diagonal one of this warp's rows; with an explicit mask, every tile. */
        const bool edge = key0 + BLOCK > p.s || (p.causal && key0 + BLOCK - 1 > first) || mask_kind;
        coil_u32 af[HOLD ? 1 : KC][4];
        float s[8][4], dp[8][4];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) s[j][e] = dp[j][e] = 0.f;
        }
        if constexpr (!HOLD) coil_a_frags<DP>(sq, warp * 16, af);
        coil_mma_abt<DP, BF16>(s, HOLD ? qf : af, sk);
        if constexpr (!HOLD) coil_a_frags<DP>(sdo, warp * 16, af);
        coil_mma_abt<DP, BF16>(dp, HOLD ? gf : af, sv);
        /* With dropout: which of this thread's 32 weights the forward kept (bit j * 4 + e). */
        const coil_u32 kept = p.drop.threshold ? coil_drop_frag_bits<8>(p.drop, p.l, p.s, first + g, key0 + 2 * t) : ~0u;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float pj = coil_exp2(s[j][e] * p.scale_log2 - lse2[e >> 1]);
                if (edge) {
                    const int key = key0 + j * 8 + 2 * t + (e & 1), row = first + g + (e >> 1) * 8;
                    if (key >= p.s || (p.causal && key > row)) {
                        pj = 0.f;
                    } else if (mask_kind) { /* rows past the end (not stored): P = 0 */
                        const float mt = row < p.l ? coil_mask_at<BF16 ? 2 : 1>(mask, p.mask, mask_kind, mb, row, key) : COIL_NEG_INF;
                        pj = coil_masked_p(s[j][e] * p.scale_log2, mt, lse2[e >> 1]);
                    }
                }
                /* dS = P (dP Z / (1 - p) - delta); rows and keys past the ends have P 0 or are not stored. */
                const float dpd = p.drop.threshold ? coil_kept_or_zero(p.drop, (kept >> (j * 4 + e)) & 1u, dp[j][e]) : dp[j][e];
                s[j][e] = pj * (dpd - dl[e >> 1]);
            }
        }
        coil_mma_ab<DP, BF16>(dq_acc, s, sk); /* dQ += dS K (scaled at the end) */
        __syncthreads(); /* every warp is done with the K and V tiles */
    }
    coil_cp_async_wait<0>();
    const float scale[2] = {p.scale, p.scale};
    coil_store_rows<DP, BF16>(dq + coil_batch_base(p.dq, p.heads), p.dq.row, first, p.l, p.d, dq_acc, scale);
}

/* The tensor-core backward: 4 warps; block y < key_blocks: dK, dV of key block y (the first
   have the most query rows to walk when causal), and dS into `ds` unless it is null; the
   others: dQ of a query block, the last (most keys when causal) first. dq, dk, dv may be null:
   not wanted. */
template <int DP, bool BF16, bool MASKED>
COIL_D void coil_attention_bwd_mma(const coil_u16 *__restrict__ q, const coil_u16 *__restrict__ k,
                                   const coil_u16 *__restrict__ v, const coil_u16 *__restrict__ dout,
                                   const float *__restrict__ lse, const float *__restrict__ delta,
                                   coil_u16 *__restrict__ dq, coil_u16 *__restrict__ dk, coil_u16 *__restrict__ dv,
                                   const void *__restrict__ mask, coil_u16 *__restrict__ ds,
                                   const CoilAttnBwdParams &p) {
    const int y = blockIdx.y;
    if (y < p.key_blocks) {
        coil_attention_bwd_dkdv<DP, BF16, MASKED>(q, k, v, dout, lse, delta, dk, dv, mask, ds, p, y);
    } else {
        coil_attention_bwd_dq<DP, BF16, MASKED>(q, k, v, dout, lse, delta, dq, mask, p, gridDim.y - 1 - y);
    }
}

/* dQ = scale dS K of 64 query rows (warp w: rows 16w .. 16w + 15) from the dS the dK, dV blocks
   stored (key-major: element (key, row) of batch index x at ds[(x s + key) l + row]; l a multiple
   of 8, so that its rows are 16-byte aligned): per key block the rows see, a dS^T tile (64 keys x
   64 rows) and a K tile, double-buffered in shared memory; the warp's A fragments of dS are read
   transposed (ldmatrix .trans). Shared memory: two stages of the two tiles. The last query block
   (most keys when causal) first. */
template <int DP, bool BF16>
COIL_D void coil_attention_bwd_dq_stored(const coil_u16 *__restrict__ k, const coil_u16 *__restrict__ ds,
                                         coil_u16 *__restrict__ dq, const CoilAttnBwdParams &p) {
    constexpr int BLOCK = 64, SPITCH = BLOCK + 8, KC = BLOCK / 16, NT = DP / 8;
    constexpr int STILE = BLOCK * SPITCH, KTILE = BLOCK * (DP + 8), STAGE = STILE + KTILE;
    coil_u16 *smem = COIL_DYNAMIC_SHARED;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row0 = (gridDim.y - 1 - blockIdx.y) * BLOCK;
    const coil_u16 *kb = k + coil_batch_base(p.k, p.heads);
    const coil_u16 *sb = ds + (long long)blockIdx.x * p.s * p.l + row0;
    int kblocks = (p.s + BLOCK - 1) / BLOCK;
    if (p.causal) kblocks = coil_imin(kblocks, row0 / BLOCK + 1);
    auto load = [&](int kbi, int stage) {
        coil_u16 *st = smem + stage * STAGE;
        coil_tile_load<BLOCK>(st, sb, p.l, kbi * BLOCK, p.s, p.l - row0);
        coil_tile_load<DP>(st + STILE, kb, p.k.row, kbi * BLOCK, p.s, p.d);
    };
    if (kblocks > 0) load(0, 0);
    coil_cp_async_commit();
    float acc[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
    /* Lane l addresses row l % 8 of matrix l / 8 of an A fragment: matrix m holds rows
       8 (m & 1) .. + 7 and keys 8 (m >> 1) .. + 7 of the warp's 16 x 16 chunk, stored as keys. */
    const int m = lane >> 3, mrow = warp * 16 + (m & 1) * 8, mkey = (m >> 1) * 8 + (lane & 7);
    for (int kbi = 0, stage = 0; kbi < kblocks; ++kbi, stage ^= 1) {
        if (kbi + 1 < kblocks) load(kbi + 1, stage ^ 1);
        coil_cp_async_commit(); /* maybe empty: the wait below counts alike */
        coil_cp_async_wait<1>(); /* this block's tiles landed (the next block's may not have) */
        __syncthreads();
        const coil_u16 *st = smem + stage * STAGE;
#pragma unroll
        for (int kc = 0; kc < KC; ++kc) {
            coil_u32 a[4];
            coil_ldmatrix_x4_trans(coil_smem(st) + 2 * ((kc * 16 + mkey) * SPITCH + mrow), a);
            coil_mma_chunk_b<DP, BF16>(acc, a, st + STILE, kc);
        }
        __syncthreads(); /* every warp is done with this stage before it is loaded again */
    }
    coil_cp_async_wait<0>();
    const float scale[2] = {p.scale, p.scale};
    coil_store_rows<DP, BF16>(dq + coil_batch_base(p.dq, p.heads), p.dq.row, row0 + warp * 16, p.l, p.d, acc, scale);
}

/* The simple backward: 64 threads, one key (dK, dV blocks) or one query row (dQ blocks) each;
   the rows it walks staged in blocks of 16 in shared memory (f32); any strides. */
template <int DP, int KIND>
COIL_D void coil_attention_bwd_simple(const void *q, const void *k, const void *v, const void *dout, const float *lse,
                                      const float *delta, void *dq, void *dk, void *dv, const void *mask,
                                      const CoilAttnBwdParams &p) {
    constexpr int ROWS = 16;
    __shared__ float sa[ROWS][DP], sb[ROWS][DP], s_lse[ROWS], s_delta[ROWS];
    const long long qb = coil_batch_base(p.q, p.heads), kb = coil_batch_base(p.k, p.heads);
    const long long vb = coil_batch_base(p.v, p.heads), gb = coil_batch_base(p.dout, p.heads);
    const long long mb = p.mask_kind ? coil_batch_base(p.mask, p.heads) : 0;
    const int y = blockIdx.y;
    if (y < p.key_blocks) {
        /* This thread's key; the query rows that see the block's keys, 16 at a time. */
        const int key0 = y * 64, key = key0 + threadIdx.x;
        float kr[DP], vr[DP], dk_acc[DP], dv_acc[DP];
#pragma unroll
        for (int c = 0; c < DP; ++c) {
            const bool in = key < p.s && c < p.d;
            kr[c] = in ? coil_att_load<KIND>(k, kb + key * p.k.row + c * p.k.col) : 0.f;
            vr[c] = in ? coil_att_load<KIND>(v, vb + key * p.v.row + c * p.v.col) : 0.f;
            dk_acc[c] = dv_acc[c] = 0.f;
        }
        for (int row0 = p.causal ? key0 : 0; row0 < p.l; row0 += ROWS) {
            __syncthreads(); /* every thread is done with the previous rows */
            for (int i = threadIdx.x; i < ROWS * DP; i += 64) {
                const int r = i / DP, c = i - r * DP, row = row0 + r;
                const bool in = row < p.l && c < p.d;
                sa[r][c] = in ? coil_att_load<KIND>(q, qb + row * p.q.row + c * p.q.col) : 0.f;
                sb[r][c] = in ? coil_att_load<KIND>(dout, gb + row * p.dout.row + c * p.dout.col) : 0.f;
            }
            if (threadIdx.x < ROWS) {
                s_lse[threadIdx.x] = coil_lse2(lse, row0 + threadIdx.x, p.l);
                s_delta[threadIdx.x] = coil_row_stat(delta, row0 + threadIdx.x, p.l);
            }
            __syncthreads();
            for (int j = 0; j < ROWS; ++j) {
                const int row = row0 + j;
                if (row >= p.l || key >= p.s || (p.causal && key > row)) continue;
                const float mt = p.mask_kind ? coil_mask_at<KIND>(mask, p.mask, p.mask_kind, mb, row, key) : 0.f;
                if (mt == COIL_NEG_INF) continue; /* dropped by the mask: P = 0 */
                float x = 0.f, dp = 0.f;
#pragma unroll
                for (int c = 0; c < DP; ++c) {
                    x += sa[j][c] * kr[c];
                    dp += sb[j][c] * vr[c];
                }
                const float pj = coil_exp2(x * p.scale_log2 + mt - s_lse[j]);
                /* With dropout: the kept weight and dO . v scaled, the dropped ones 0. */
                const bool kept = !p.drop.threshold || coil_drop_keeps(p.drop, coil_drop_index(p.l, p.s, row, key));
                const float factor = p.drop.threshold ? (kept ? p.drop.scale : 0.f) : 1.f;
                const float ds = pj * (dp * factor - s_delta[j]), pd = pj * factor;
#pragma unroll
                for (int c = 0; c < DP; ++c) {
                    dv_acc[c] += pd * sb[j][c];
                    dk_acc[c] += ds * sa[j][c];
                }
            }
        }
        if (key < p.s) {
            const long long kout = coil_batch_base(p.dk, p.heads), vout = coil_batch_base(p.dv, p.heads);
#pragma unroll
            for (int c = 0; c < DP; ++c) {
                if (c >= p.d) continue;
                if (dk) coil_att_store<KIND>(dk, kout + key * p.dk.row + c * p.dk.col, dk_acc[c] * p.scale);
                if (dv) coil_att_store<KIND>(dv, vout + key * p.dv.row + c * p.dv.col, dv_acc[c]);
            }
        }
    } else {
        /* This thread's query row; the keys it sees, 16 at a time. */
        const int row0 = (gridDim.y - 1 - y) * 64, row = row0 + threadIdx.x;
        float qr[DP], gr[DP], dq_acc[DP];
#pragma unroll
        for (int c = 0; c < DP; ++c) {
            const bool in = row < p.l && c < p.d;
            qr[c] = in ? coil_att_load<KIND>(q, qb + row * p.q.row + c * p.q.col) : 0.f;
            gr[c] = in ? coil_att_load<KIND>(dout, gb + row * p.dout.row + c * p.dout.col) : 0.f;
            dq_acc[c] = 0.f;
        }
        const float lse2 = coil_lse2(lse, row, p.l), dl = coil_row_stat(delta, row, p.l);
        const int keys = p.causal ? coil_imin(p.s, row0 + 64) : p.s;
        for (int key0 = 0; key0 < keys; key0 += ROWS) {
            __syncthreads(); /* every thread is done with the previous keys */
            for (int i = threadIdx.x; i < ROWS * DP; i += 64) {
                const int r = i / DP, c = i - r * DP, key = key0 + r;
                const bool in = key < p.s && c < p.d;
                sa[r][c] = in ? coil_att_load<KIND>(k, kb + key * p.k.row + c * p.k.col) : 0.f;
                sb[r][c] = in ? coil_att_load<KIND>(v, vb + key * p.v.row + c * p.v.col) : 0.f;
            }
            __syncthreads();
            for (int j = 0; j < ROWS; ++j) {
                const int key = key0 + j;
                if (row >= p.l || key >= p.s || (p.causal && key > row)) continue;
                const float mt = p.mask_kind ? coil_mask_at<KIND>(mask, p.mask, p.mask_kind, mb, row, key) : 0.f;
                if (mt == COIL_NEG_INF) continue; /* dropped by the mask: P = 0 */
                float x = 0.f, dp = 0.f;
#pragma unroll
                for (int c = 0; c < DP; ++c) {
                    x += qr[c] * sa[j][c];
                    dp += gr[c] * sb[j][c];
                }
                const float dpd = coil_dropped(p.drop, coil_drop_index(p.l, p.s, row, key), dp);
                const float ds = coil_exp2(x * p.scale_log2 + mt - lse2) * (dpd - dl);
#pragma unroll
                for (int c = 0; c < DP; ++c) dq_acc[c] += ds * sa[j][c];
            }
        }
        if (row < p.l) {
            const long long qout = coil_batch_base(p.dq, p.heads);
#pragma unroll
            for (int c = 0; c < DP; ++c)
                if (c < p.d) coil_att_store<KIND>(dq, qout + row * p.dq.row + c * p.dq.col, dq_acc[c] * p.scale);
        }
    }
}

/* Resident blocks per SM the tensor-core kernel is compiled for (as the forward's): one (248
   registers at head dim 64); two or three ran GPT-2's backward 2-5% slower on an H200. */
#ifndef COIL_ATTN_BWD_MIN_BLOCKS
#define COIL_ATTN_BWD_MIN_BLOCKS 1
#endif
/* MASKED false: the mask's code compiled out (the tensor-core kernel's maskless entry point). */
#define COIL_ATTENTION_BWD_MMA(NAME, DP, BF16, MASKED)                                                       \
    extern "C" __global__ void __launch_bounds__(128, COIL_ATTN_BWD_MIN_BLOCKS)                               \
        NAME(const coil_u16 *q, const coil_u16 *k, const coil_u16 *v, const coil_u16 *dout, const float *lse, \
             const float *delta, coil_u16 *dq, coil_u16 *dk, coil_u16 *dv, const void *mask, coil_u16 *ds,    \
             CoilAttnBwdParams p) {                                                                           \
        coil_attention_bwd_mma<DP, BF16, MASKED>(q, k, v, dout, lse, delta, dq, dk, dv, mask, ds, p);         \
    }
#define COIL_ATTENTION_BWD_DQ_STORED(NAME, DP, BF16)                                                         \
    extern "C" __global__ void __launch_bounds__(128)                                                         \
        NAME(const coil_u16 *k, const coil_u16 *ds, coil_u16 *dq, CoilAttnBwdParams p) {                      \
        coil_attention_bwd_dq_stored<DP, BF16>(k, ds, dq, p);                                                 \
    }
#define COIL_ATTENTION_BWD_SIMPLE(NAME, DP, KIND)                                                            \
    extern "C" __global__ void __launch_bounds__(64)                                                          \
        NAME(const void *q, const void *k, const void *v, const void *dout, const float *lse,                 \
             const float *delta, void *dq, void *dk, void *dv, const void *mask, void * /* ds: not stored */, \
             CoilAttnBwdParams p) {                                                                           \
        coil_attention_bwd_simple<DP, KIND>(q, k, v, dout, lse, delta, dq, dk, dv, mask, p);                  \
    }
#define COIL_ATTENTION_DELTA(NAME, KIND)                                                                     \
    extern "C" __global__ void __launch_bounds__(128)                                                         \
        NAME(const void *o, const void *dout, float *delta, CoilAttnDeltaParams p) {                          \
        coil_attention_delta<KIND>(o, dout, delta, p);                                                        \
    }
