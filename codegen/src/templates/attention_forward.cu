/* coil attention template: FlashAttention-2-style forward and its split-KV (flash-decoding)
   variants (see codegen/src/templates/attention.rs). Follows attention_common.cuh. */

struct CoilAttnParams {
    CoilAttnOperand q, k, v, o;
    CoilAttnOperand mask; /* element (b, h, row, key) of the mask; broadcast dims have stride 0 */
    int heads;            /* batch indices per outer index: blockIdx.x = b * heads + h */
    int l, s, d;          /* query rows, keys, head dim */
    float scale_log2;     /* scale * log2(e): softmax in powers of two */
    int diagonal;         /* 1: query row r sees keys j <= coil_diag(r) only (causal; a structured mask) */
    int mask_kind;        /* 0 none; 1 bool (a byte per element, nonzero keeps); 2 added, of the operands' dtype */
    int chunk;            /* split kernels: keys per split (a multiple of 64) */
    int splits;           /* split kernels: splits per batch index (gridDim.y) */
    int period;           /* the diagonal's row term: r % period, or r (0) */
    long long diag_const; /* the diagonal's base: diag_const + *diag_offset (the kernels' argument, or null) */
    CoilAttnDropout drop; /* dropout on the weights (threshold 0: none) */
};

/* The diagonal rule: row r sees keys j <= base + (period ? r % period : r). Causal attention is
   base 0 without a period; a decode step or prefill over a KV cache has the cache position as
   its offset (read once per block: a CUDA graph replay reads the value of its run) and, for
   grouped-query rows, the step's length as its period. Keys are ints: the values are clamped
   to [-1, 2^30] (-1: no key). */
COIL_D long long coil_diag_base(const CoilAttnParams &p, const long long *diag_offset) {
    return p.diagonal && diag_offset ? p.diag_const + *diag_offset : p.diag_const;
}
COIL_D int coil_clamp_key(long long x) { return x < -1 ? -1 : x > (1 << 30) ? (1 << 30) : (int)x; }
/* The last key row `row` sees (1 << 30 without a diagonal rule). */
COIL_D int coil_diag(const CoilAttnParams &p, long long base, int row) {
    if (!p.diagonal) return 1 << 30;
    return coil_clamp_key(base + (p.period ? row % p.period : row));
}
/* Whether rows [a, b] reach every row term of a period (or wrap one): the largest term is then
   period - 1 and the smallest 0. */
COIL_D bool coil_diag_wraps(const CoilAttnParams &p, int a, int b) {
    return p.period && (b - a >= p.period - 1 || a % p.period > b % p.period);
}
/* The largest and the smallest coil_diag over rows [a, b], a <= b. */
COIL_D int coil_diag_max(const CoilAttnParams &p, long long base, int a, int b) {
    return p.diagonal && coil_diag_wraps(p, a, b) ? coil_clamp_key(base + p.period - 1) : coil_diag(p, base, b);
}
COIL_D int coil_diag_min(const CoilAttnParams &p, long long base, int a, int b) {
    return p.diagonal && coil_diag_wraps(p, a, b) ? coil_clamp_key(base) : coil_diag(p, base, a);
}
/* Tiles of 64 keys from 0 that rows [a, b] see (to `tiles`). */
COIL_D int coil_diag_tiles(const CoilAttnParams &p, long long base, int a, int b, int tiles) {
    const int top = coil_diag_max(p, base, a, b);
    return top < 0 ? 0 : coil_imin(tiles, top / 64 + 1);
}

/* The mask's term for (row, key) of the batch index at mask element `base`, in log2 units: 0 or
   -inf for a bool mask, the value times log2(e) for an added one. KIND: the added mask's element
   kind (coil_att_load). */
template <int KIND>
COIL_D float coil_mask_term(const void *mask, long long base, const CoilAttnParams &p, int row, int key) {
    return coil_mask_at<KIND>(mask, p.mask, p.mask_kind, base, row, key);
}

/* Whether rows [row0, row0 + ROWS) see any key of [key0, key0 + KEYS) (within l and s, the
   diagonal rule at `dbase`, the mask at `base`): else the tile is skipped, its keys and values
   never read. With a mask, every one of the block's NT threads must call it (a barrier); the
   answer is the block's. */
template <int KIND, int NT, int ROWS, int KEYS>
COIL_D bool coil_tile_live(const void *mask, long long base, long long dbase, const CoilAttnParams &p, int mask_kind,
                           int row0, int key0) {
    if (mask_kind == 0) return key0 < p.s && key0 <= coil_diag_max(p, dbase, row0, coil_imin(row0 + ROWS, p.l) - 1);
    bool live = false;
    for (int i = threadIdx.x; i < ROWS * KEYS && !live; i += NT) {
        const int row = row0 + i / KEYS, key = key0 + i % KEYS;
        if (row < p.l && key < p.s && key <= coil_diag(p, dbase, row))
            live = coil_mask_term<KIND>(mask, base, p, row, key) != COIL_NEG_INF;
    }
    return __syncthreads_or(live) != 0;
}

/* The first tile of [from, last) (64 keys each) that rows [row0, row0 + ROWS) see, or last. */
template <int KIND, int ROWS>
COIL_D int coil_next_live(const void *mask, long long base, long long dbase, const CoilAttnParams &p, int mask_kind,
                          int row0, int from, int last) {
    while (from < last && !coil_tile_live<KIND, 128, ROWS, 64>(mask, base, dbase, p, mask_kind, row0, from * 64)) ++from;
    return from;
}

/* Where the split kernels leave a batch index's partial results (f32): the unnormalized rows
   at part[((bx * splits + split) * l + row) * d + col], then, after all of them, each row's
   maximum (log2 units) and sum at [((bx * splits + split) * l + row) * 2 + {0, 1}]. */
COIL_D float *coil_part_rows(float *part, const CoilAttnParams &p, int bx, int split) {
    return part + ((long long)bx * p.splits + split) * p.l * p.d;
}
COIL_D float *coil_part_stats(float *part, const CoilAttnParams &p, int bx, int split) {
    return part + (long long)gridDim.x * p.splits * p.l * p.d + ((long long)bx * p.splits + split) * p.l * 2;
}

/* Row `row`'s end of a split kernel, `sum` its unnormalized column `col` (of rows below l and
   columns below d), `mx` and `total` its maximum and sum: with one split the output element
   (0 for a row that sees no key, as PyTorch) and the logsumexp (by column 0), else the partial. */
template <int KIND>
COIL_D void coil_split_store(void *o, float *lse, float *part, const CoilAttnParams &p, long long ob, int row, int col,
                             float sum, float mx, float total) {
    const int bx = blockIdx.x;
    if (gridDim.y == 1) {
        coil_att_store<KIND>(o, ob + row * p.o.row + col * p.o.col, total > 0.f ? sum / total : 0.f);
        if (lse && col == 0)
            lse[(long long)bx * p.l + row] = total > 0.f ? (mx + coil_log2(total)) * COIL_LN2 : COIL_NEG_INF;
        return;
    }
    /* A split that saw no key leaves its rows unwritten: the combine reads its sum (0) only. */
    if (total > 0.f) coil_part_rows(part, p, bx, blockIdx.y)[row * p.d + col] = sum;
    if (col == 0) {
        float *stats = coil_part_stats(part, p, bx, blockIdx.y) + row * 2;
        stats[0] = mx;
        stats[1] = total;
    }
}

/* Dropout of a warp's probability fragments s[j][e] (row `row` + (e >> 1) * 8, key `key` +
   j * 8 + (e & 1): this thread's of the m16n8 layout) in place; rows and keys past the ends
   are left (their weights are 0). Every lane of the warp calls it. */
template <int JT> COIL_D void coil_drop_fragments(const CoilAttnParams &p, float (*s)[4], int row, int key) {
    const coil_u32 kept = coil_drop_frag_bits<JT>(p.drop, p.l, p.s, row, key);
#pragma unroll
    for (int j = 0; j < JT; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[j][e] = coil_kept_or_zero(p.drop, (kept >> (j * 4 + e)) & 1u, s[j][e]);
    }
}

/* The tensor-core kernels: 4 warps, keys in tiles of 64 staged by cp.async; tiles no row of the
   block sees (diagonal rule, mask) are skipped. SPLIT false: 64 query rows of one batch index
   (warp w: rows 16w..16w+15) against every key (blockIdx.y: the row block, last first). SPLIT
   true (l <= 16): the 16 query rows against keys [blockIdx.y * chunk, + chunk) (warp w: keys
   16w..16w+15 of each tile), the warps' results combined in shared memory at the end, then
   stored by coil_split_store. With `lse`, also the row logsumexp (natural log), at
   lse[batch index * l + row]. */
template <int DP, bool BF16, bool SPLIT, bool MASKED>
COIL_D void coil_attention_mma(const coil_u16 *__restrict__ q, const coil_u16 *__restrict__ k,
                               const coil_u16 *__restrict__ v, coil_u16 *__restrict__ o, float *__restrict__ lse,
                               const void *__restrict__ mask, float *__restrict__ part,
                               const long long *__restrict__ diag_offset, const CoilAttnParams &p) {
    constexpr int BLOCK = 64, PITCH = DP + 8, KC = DP / 16, NT = DP / 8, KIND = BF16 ? 2 : 1;
    constexpr int ROWS = SPLIT ? 16 : 64; /* query rows per block */
    constexpr int JT = SPLIT ? 2 : 8;     /* n-tiles of 8 keys per warp and tile */
    /* K tile, then V tile, which first stages the Q tile (16-byte aligned rows: PITCH * 2
       bytes); the split kernels' f32 scratch at the end. */
    __shared__ coil_tile<2 * BLOCK * PITCH> kv;
    coil_u16 *sk = kv.e, *sv = kv.e + BLOCK * PITCH;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int row0 = SPLIT ? 0 : (gridDim.y - 1 - blockIdx.y) * BLOCK;
    const int wrow = SPLIT ? 0 : warp * 16; /* the warp's first row in the block */
    const int wkey = SPLIT ? warp * 16 : 0; /* the warp's first key in a tile */
    const coil_u16 *qb = q + coil_batch_base(p.q, p.heads);
    const coil_u16 *kb = k + coil_batch_base(p.k, p.heads);
    const coil_u16 *vb = v + coil_batch_base(p.v, p.heads);
    /* Compiled without the mask's code unless MASKED (a maskless call pays nothing for it). */
    const int mask_kind = MASKED ? p.mask_kind : 0;
    const long long mb = mask_kind ? coil_batch_base(p.mask, p.heads) : 0;
    const long long db = coil_diag_base(p, diag_offset);
    int first = 0, last = (p.s + BLOCK - 1) / BLOCK;
    if (SPLIT) {
        first = blockIdx.y * (p.chunk / BLOCK);
        last = coil_imin(last, first + p.chunk / BLOCK);
    }
    /* No tile past the block's largest diagonal. */
    last = coil_diag_tiles(p, db, row0, coil_imin(row0 + ROWS, p.l) - 1, last);
    /* The last key of this thread's two rows (g, g + 8 of the warp's 16), and the least of the
       warp's rows: a tile past it needs the per-element rule. */
    const int rdiag[2] = {coil_diag(p, db, row0 + wrow + g), coil_diag(p, db, row0 + wrow + g + 8)};
    const int wdiag = coil_diag_min(p, db, row0 + wrow, row0 + wrow + 15);

    int cur = coil_next_live<KIND, ROWS>(mask, mb, db, p, mask_kind, row0, first, last);
    coil_tile_load<DP>(sv, qb, p.q.row, row0, p.l, p.d);
    if (cur < last) coil_tile_load<DP>(sk, kb, p.k.row, cur * BLOCK, p.s, p.d);
    coil_cp_async_commit();
    coil_cp_async_wait<0>();
    __syncthreads();
    /* This warp's 16 query rows as A fragments, one per 16 columns of the head dim. */
    coil_u32 qf[KC][4];
    coil_a_frags<DP>(sv, wrow, qf);
    __syncthreads(); /* every warp holds its Q: the tile may take V */

    float acc[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
    /* Per thread, rows g and g + 8 of the warp's 16: running max (log2 units) and partial sum. */
    float row_max[2] = {COIL_NEG_INF, COIL_NEG_INF}, row_sum[2] = {0.f, 0.f};
    while (cur < last) {
        const int key0 = cur * BLOCK;
        coil_tile_load<DP>(sv, vb, p.v.row, key0, p.s, p.d);
        coil_cp_async_commit();

        /* S = Q K^T for the warp's 16 rows x 8 JT keys. */
        float s[JT][4];
#pragma unroll
        for (int j = 0; j < JT; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
        coil_mma_abt<DP, BF16, JT>(s, qf, sk + wkey * PITCH);
        const int next = coil_next_live<KIND, ROWS>(mask, mb, db, p, mask_kind, row0, cur + 1, last);
        __syncthreads(); /* every warp is done with the K tile */
        if (next < last) coil_tile_load<DP>(sk, kb, p.k.row, next * BLOCK, p.s, p.d);
        coil_cp_async_commit(); /* empty after the last tile: the waits below count alike */

        /* Scores in log2 units; keys past the end, past the row's diagonal, or dropped by the
           mask are -inf; an added mask adds. */
        const bool edge = key0 + BLOCK > p.s || key0 + BLOCK - 1 > wdiag || mask_kind;
#pragma unroll
        for (int j = 0; j < JT; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float x = s[j][e] * p.scale_log2;
                if (edge) {
                    const int key = key0 + wkey + j * 8 + 2 * t + (e & 1);
                    const int row = row0 + wrow + g + (e >> 1) * 8;
                    if (key >= p.s || key > rdiag[e >> 1]) x = COIL_NEG_INF;
                    else if (mask_kind && row < p.l) x += coil_mask_term<KIND>(mask, mb, p, row, key);
                }
                s[j][e] = x;
            }
        }
        /* Online softmax: new maximum, rescale what was accumulated, probabilities in place. */
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float mx = row_max[r];
#pragma unroll
            for (int j = 0; j < JT; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * r], s[j][2 * r + 1]));
            mx = coil_quad_max(mx);
            /* A row with no key yet: -inf - -inf would be NaN; every term is 0 anyway. */
            const float base = mx == COIL_NEG_INF ? 0.f : mx;
            const float alpha = coil_exp2(row_max[r] - base);
            row_max[r] = mx;
            float sum = 0.f;
#pragma unroll
            for (int j = 0; j < JT; ++j) {
                s[j][2 * r] = coil_exp2(s[j][2 * r] - base);
                s[j][2 * r + 1] = coil_exp2(s[j][2 * r + 1] - base);
                sum += s[j][2 * r] + s[j][2 * r + 1];
            }
            row_sum[r] = row_sum[r] * alpha + sum;
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                acc[n][2 * r] *= alpha;
                acc[n][2 * r + 1] *= alpha;
            }
        }
        /* Dropout on the weights (after the sums took them whole): P of O += P V only. */
        if (p.drop.threshold) coil_drop_fragments<JT>(p, s, row0 + wrow + g, key0 + wkey + 2 * t);

        coil_cp_async_wait<1>(); /* this thread's V copies landed (the next K's may not have) */
        __syncthreads();         /* ... and every thread's */
        coil_mma_ab<DP, BF16, JT / 2>(acc, s, sv + wkey * PITCH); /* O += P V */
        coil_cp_async_wait<0>(); /* the next K tile landed */
        __syncthreads();         /* for every thread, and every warp is done with the V tile */
        cur = next;
    }

    float total[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) total[r] = coil_quad_sum(row_sum[r]);
    if (!SPLIT) {
        /* O / l (0 for a row that sees no key, as PyTorch), rounded once, stored two elements at
           a time through the output's strides; the logsumexp is max + log(sum), from log2 units. */
        float inv[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            inv[r] = total[r] > 0.f ? 1.f / total[r] : 0.f;
            const int row = row0 + wrow + g + r * 8;
            if (lse && t == 0 && row < p.l)
                lse[(long long)blockIdx.x * p.l + row] =
                    total[r] > 0.f ? (row_max[r] + coil_log2(total[r])) * COIL_LN2 : COIL_NEG_INF;
        }
        coil_store_rows<DP, BF16>(o + coil_batch_base(p.o, p.heads), p.o.row, row0 + wrow, p.l, p.d, acc, inv);
        return;
    }
    /* The warps saw different keys of the same 16 rows: their maxima and sums, then their rows
       rescaled to the block's maximum, through shared memory (the tiles are free: the loop
       ended with a barrier), summed over the warps. */
    float *stats = (float *)kv.e;      /* [4 warps][16 rows][max, sum] */
    float *rows = stats + 4 * 16 * 2;  /* [4 warps][16 rows][DP] */
    if (t == 0) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            stats[(warp * 16 + g + 8 * r) * 2] = row_max[r];
            stats[(warp * 16 + g + 8 * r) * 2 + 1] = total[r];
        }
    }
    __syncthreads();
    /* The block's maximum and sum of row `row`. */
    auto block_stats = [&](int row, float &mx, float &sum) {
        mx = COIL_NEG_INF;
        for (int w = 0; w < 4; ++w) mx = fmaxf(mx, stats[(w * 16 + row) * 2]);
        const float base = mx == COIL_NEG_INF ? 0.f : mx;
        sum = 0.f;
        for (int w = 0; w < 4; ++w) sum += stats[(w * 16 + row) * 2 + 1] * coil_exp2(stats[(w * 16 + row) * 2] - base);
    };
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        float mx, sum;
        block_stats(g + 8 * r, mx, sum);
        const float factor = coil_exp2(row_max[r] - (mx == COIL_NEG_INF ? 0.f : mx));
        float *out = rows + (warp * 16 + g + 8 * r) * DP;
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            out[n * 8 + 2 * t] = acc[n][2 * r] * factor;
            out[n * 8 + 2 * t + 1] = acc[n][2 * r + 1] * factor;
        }
    }
    __syncthreads();
    const long long ob = coil_batch_base(p.o, p.heads);
    for (int i = threadIdx.x; i < p.l * p.d; i += 128) {
        const int row = i / p.d, col = i - row * p.d;
        float mx, sum;
        block_stats(row, mx, sum);
        float x = 0.f;
        for (int w = 0; w < 4; ++w) x += rows[(w * 16 + row) * DP + col];
        coil_split_store<KIND>(o, lse, part, p, ob, row, col, x, mx, sum);
    }
}

/* The simple kernel: 64 threads, one query row each; keys and values in tiles of 16 in shared
   memory (f32), tiles no row of the block sees skipped; any strides. */
template <int DP, int KIND>
COIL_D void coil_attention_simple(const void *q, const void *k, const void *v, void *o, float *lse, const void *mask,
                                  const long long *diag_offset, const CoilAttnParams &p) {
    constexpr int KEYS = 16;
    __shared__ float sk[KEYS][DP];
    __shared__ float sv[KEYS][DP];
    const int qblock = gridDim.y - 1 - blockIdx.y;
    const int row0 = qblock * 64, row = row0 + threadIdx.x;
    const long long qb = coil_batch_base(p.q, p.heads), kb = coil_batch_base(p.k, p.heads);
    const long long vb = coil_batch_base(p.v, p.heads), ob = coil_batch_base(p.o, p.heads);
    const long long mb = p.mask_kind ? coil_batch_base(p.mask, p.heads) : 0;
    const long long db = coil_diag_base(p, diag_offset);
    const int rdiag = coil_diag(p, db, row);
    float qr[DP], acc[DP];
#pragma unroll
    for (int c = 0; c < DP; ++c) {
        qr[c] = row < p.l && c < p.d ? coil_att_load<KIND>(q, qb + row * p.q.row + c * p.q.col) * p.scale_log2 : 0.f;
        acc[c] = 0.f;
    }
    float row_max = COIL_NEG_INF, row_sum = 0.f;
    const int keys = coil_imin(p.s, coil_diag_max(p, db, row0, coil_imin(row0 + 64, p.l) - 1) + 1);
    for (int key0 = 0; key0 < keys; key0 += KEYS) {
        if (!coil_tile_live<KIND, 64, 64, KEYS>(mask, mb, db, p, p.mask_kind, row0, key0)) continue;
        __syncthreads(); /* every thread is done with the previous tile */
        for (int i = threadIdx.x; i < KEYS * DP; i += 64) {
            const int r = i / DP, c = i - r * DP, key = key0 + r;
            const bool in = key < p.s && c < p.d;
            sk[r][c] = in ? coil_att_load<KIND>(k, kb + key * p.k.row + c * p.k.col) : 0.f;
            sv[r][c] = in ? coil_att_load<KIND>(v, vb + key * p.v.row + c * p.v.col) : 0.f;
        }
        __syncthreads();
        float sc[KEYS];
        float mx = row_max;
#pragma unroll
        for (int j = 0; j < KEYS; ++j) {
            float x = 0.f;
#pragma unroll
            for (int c = 0; c < DP; ++c) x += qr[c] * sk[j][c];
            const int key = key0 + j;
            if (key >= p.s || key > rdiag) x = COIL_NEG_INF;
            else if (p.mask_kind && row < p.l) x += coil_mask_term<KIND>(mask, mb, p, row, key);
            sc[j] = x;
            mx = fmaxf(mx, sc[j]);
        }
        const float base = mx == COIL_NEG_INF ? 0.f : mx;
        const float alpha = coil_exp2(row_max - base);
        row_max = mx;
        row_sum *= alpha;
#pragma unroll
        for (int c = 0; c < DP; ++c) acc[c] *= alpha;
#pragma unroll
        for (int j = 0; j < KEYS; ++j) {
            float pj = coil_exp2(sc[j] - base);
            row_sum += pj;
            if (p.drop.threshold && row < p.l && key0 + j < p.s)
                pj = coil_dropped(p.drop, coil_drop_index(p.l, p.s, row, key0 + j), pj);
#pragma unroll
            for (int c = 0; c < DP; ++c) acc[c] += pj * sv[j][c];
        }
    }
    if (row < p.l) {
        const float inv = row_sum > 0.f ? 1.f / row_sum : 0.f;
#pragma unroll
        for (int c = 0; c < DP; ++c)
            if (c < p.d) coil_att_store<KIND>(o, ob + row * p.o.row + c * p.o.col, acc[c] * inv);
        if (lse) lse[(long long)blockIdx.x * p.l + row] = row_sum > 0.f ? (row_max + coil_log2(row_sum)) * COIL_LN2 : COIL_NEG_INF;
    }
}

/* The simple split kernel (l <= 16; f32, or any dtype before sm_80): 128 threads, the 16 query
   rows against keys [blockIdx.y * chunk, + chunk) in tiles of 32 staged in shared memory (f32),
   tiles no row sees skipped; thread i computes scores (row, key) = (j / 32, j % 32) for
   j = i, i + 128, ... and accumulates row i / 8, columns i % 8 + 8c; any strides. */
template <int DP, int KIND>
COIL_D void coil_attention_simple_split(const void *q, const void *k, const void *v, void *o, float *lse,
                                        const void *mask, float *part, const long long *diag_offset,
                                        const CoilAttnParams &p) {
    constexpr int ROWS = 16, KEYS = 32, CPT = DP / 8;
    __shared__ float sq[ROWS][DP];
    __shared__ float sk[KEYS][DP];
    __shared__ float sv[KEYS][DP];
    __shared__ float sc[ROWS][KEYS];
    __shared__ int sdiag[ROWS]; /* each row's last key */
    const int tid = threadIdx.x, row = tid / 8, lane8 = tid % 8;
    const long long qb = coil_batch_base(p.q, p.heads), kb = coil_batch_base(p.k, p.heads);
    const long long vb = coil_batch_base(p.v, p.heads), ob = coil_batch_base(p.o, p.heads);
    const long long mb = p.mask_kind ? coil_batch_base(p.mask, p.heads) : 0;
    const long long db = coil_diag_base(p, diag_offset);
    if (tid < ROWS) sdiag[tid] = coil_diag(p, db, tid);
    for (int i = tid; i < ROWS * DP; i += 128) {
        const int r = i / DP, c = i - r * DP;
        sq[r][c] = r < p.l && c < p.d ? coil_att_load<KIND>(q, qb + r * p.q.row + c * p.q.col) * p.scale_log2 : 0.f;
    }
    float acc[CPT];
#pragma unroll
    for (int c = 0; c < CPT; ++c) acc[c] = 0.f;
    float row_max = COIL_NEG_INF, row_sum = 0.f;
    const int first = blockIdx.y * p.chunk;
    int last = coil_imin(p.s, first + p.chunk);
    last = coil_imin(last, coil_diag_max(p, db, 0, coil_imin(ROWS, p.l) - 1) + 1);
    for (int key0 = first; key0 < last; key0 += KEYS) {
        if (!coil_tile_live<KIND, 128, ROWS, KEYS>(mask, mb, db, p, p.mask_kind, 0, key0)) continue;
        __syncthreads(); /* every thread is done with the previous tile (and sq is written) */
        for (int i = tid; i < KEYS * DP; i += 128) {
            const int r = i / DP, c = i - r * DP, key = key0 + r;
            const bool in = key < p.s && c < p.d;
            sk[r][c] = in ? coil_att_load<KIND>(k, kb + key * p.k.row + c * p.k.col) : 0.f;
            sv[r][c] = in ? coil_att_load<KIND>(v, vb + key * p.v.row + c * p.v.col) : 0.f;
        }
        __syncthreads();
        for (int i = tid; i < ROWS * KEYS; i += 128) {
            const int r = i / KEYS, j = i - r * KEYS, key = key0 + j;
            float x = 0.f;
#pragma unroll
            for (int c = 0; c < DP; ++c) x += sq[r][c] * sk[j][c];
            if (key >= p.s || key > sdiag[r]) x = COIL_NEG_INF;
            else if (p.mask_kind && r < p.l) x += coil_mask_term<KIND>(mask, mb, p, r, key);
            sc[r][j] = x;
        }
        __syncthreads();
        float mx = row_max;
        for (int j = 0; j < KEYS; ++j) mx = fmaxf(mx, sc[row][j]);
        const float base = mx == COIL_NEG_INF ? 0.f : mx;
        const float alpha = coil_exp2(row_max - base);
        row_max = mx;
        row_sum *= alpha;
#pragma unroll
        for (int c = 0; c < CPT; ++c) acc[c] *= alpha;
        for (int j = 0; j < KEYS; ++j) {
            float pj = coil_exp2(sc[row][j] - base);
            row_sum += pj;
            if (p.drop.threshold && row < p.l && key0 + j < p.s)
                pj = coil_dropped(p.drop, coil_drop_index(p.l, p.s, row, key0 + j), pj);
#pragma unroll
            for (int c = 0; c < CPT; ++c) acc[c] += pj * sv[j][lane8 + 8 * c];
        }
    }
    if (row < p.l) {
#pragma unroll
        for (int c = 0; c < CPT; ++c) {
            const int col = lane8 + 8 * c;
            if (col < p.d) coil_split_store<KIND>(o, lse, part, p, ob, row, col, acc[c], row_max, row_sum);
        }
    }
}

/* The split kernels' second step: one block of 128 threads per batch index, each output element
   (row, col) from the splits' partial rows rescaled to their common maximum, over their sums
   (0 for a row no split saw a key of, as PyTorch); by column 0, the row logsumexp. */
template <int KIND>
COIL_D void coil_attention_combine(void *o, float *lse, float *part, const CoilAttnParams &p) {
    const int bx = blockIdx.x;
    const long long ob = coil_batch_base(p.o, p.heads);
    for (int i = threadIdx.x; i < p.l * p.d; i += 128) {
        const int row = i / p.d, col = i - row * p.d;
        float mx = COIL_NEG_INF;
        for (int y = 0; y < p.splits; ++y) {
            const float *stats = coil_part_stats(part, p, bx, y) + row * 2;
            if (stats[1] > 0.f) mx = fmaxf(mx, stats[0]);
        }
        float total = 0.f, x = 0.f;
        for (int y = 0; y < p.splits; ++y) {
            const float *stats = coil_part_stats(part, p, bx, y) + row * 2;
            if (stats[1] > 0.f) {
                const float f = coil_exp2(stats[0] - mx);
                total += stats[1] * f;
                x += coil_part_rows(part, p, bx, y)[row * p.d + col] * f;
            }
        }
        coil_att_store<KIND>(o, ob + row * p.o.row + col * p.o.col, total > 0.f ? x / total : 0.f);
        if (lse && col == 0) lse[(long long)bx * p.l + row] = total > 0.f ? (mx + coil_log2(total)) * COIL_LN2 : COIL_NEG_INF;
    }
}

/* Every forward entry point takes (q, k, v, o, lse or null, mask or null, split workspace or
   null, the diagonal's offset or null, params); the combine takes (o, lse or null, workspace,
   params). */
/* Resident blocks per SM the row-block tensor-core kernel is compiled for (__launch_bounds__'
   second argument: it caps the registers). At head dim 64 three (168 registers, from 232) ran
   GPT-2's forward attention 4-5% faster on an H200 (bench/NOTES.md); the split and masked
   kernels and wider heads (not measured so) keep one. -DCOIL_ATTN_FWD_MIN_BLOCKS=n (in
   COIL_NVRTC_OPTIONS) overrides it, for measuring. */
#ifdef COIL_ATTN_FWD_MIN_BLOCKS
#define COIL_ATTN_MMA_MIN_BLOCKS(DP, SPLIT, MASKED) COIL_ATTN_FWD_MIN_BLOCKS
#else
#define COIL_ATTN_MMA_MIN_BLOCKS(DP, SPLIT, MASKED) ((DP) <= 64 && !(SPLIT) && !(MASKED) ? 3 : 1)
#endif
/* MASKED false: the mask's code compiled out (the row-block kernel's maskless entry point). */
#define COIL_ATTENTION_MMA(NAME, DP, BF16, SPLIT, MASKED)                                                    \
    extern "C" __global__ void __launch_bounds__(128, COIL_ATTN_MMA_MIN_BLOCKS(DP, SPLIT, MASKED))           \
        NAME(const coil_u16 *q, const coil_u16 *k, const coil_u16 *v, coil_u16 *o, float *lse, const void *mask, \
             float *part, const long long *diag_offset, CoilAttnParams p) {                                  \
        coil_attention_mma<DP, BF16, SPLIT, MASKED>(q, k, v, o, lse, mask, part, diag_offset, p);            \
    }
#define COIL_ATTENTION_SIMPLE(NAME, DP, KIND)                                                                \
    extern "C" __global__ void __launch_bounds__(64) NAME(const void *q, const void *k, const void *v, void *o, \
                                                          float *lse, const void *mask, float *part,         \
                                                          const long long *diag_offset, CoilAttnParams p) {  \
        coil_attention_simple<DP, KIND>(q, k, v, o, lse, mask, diag_offset, p);                              \
    }
#define COIL_ATTENTION_SIMPLE_SPLIT(NAME, DP, KIND)                                                          \
    extern "C" __global__ void __launch_bounds__(128) NAME(const void *q, const void *k, const void *v,        \
                                                           void *o, float *lse, const void *mask, float *part, \
                                                           const long long *diag_offset, CoilAttnParams p) { \
        coil_attention_simple_split<DP, KIND>(q, k, v, o, lse, mask, part, diag_offset, p);                  \
    }
#define COIL_ATTENTION_COMBINE(NAME, KIND)                                                                   \
    extern "C" __global__ void __launch_bounds__(128) NAME(void *o, float *lse, float *part, CoilAttnParams p) { \
        coil_attention_combine<KIND>(o, lse, part, p);                                                       \
    }
