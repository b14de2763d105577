/* coil attention template: FlashAttention-2-style forward (see
   codegen/src/templates/attention.rs). Follows attention_common.cuh. */

struct CoilAttnParams {
    CoilAttnOperand q, k, v, o;
    int heads;        /* batch indices per outer index: blockIdx.x = b * heads + h */
    int l, s, d;      /* query rows, keys, head dim */
    float scale_log2; /* scale * log2(e): softmax in powers of two */
    int causal;       /* query row i sees keys j <= i (top-left aligned) */
};

/* The tensor-core kernel: 4 warps, 64 query rows of one batch index, keys in blocks of 64. With
   `lse`, also the row logsumexp (natural log), at lse[batch index * l + row]. */
template <int DP, bool BF16>
COIL_D void coil_attention_mma(const coil_u16 *__restrict__ q, const coil_u16 *__restrict__ k,
                               const coil_u16 *__restrict__ v, coil_u16 *__restrict__ o, float *__restrict__ lse,
                               const CoilAttnParams &p) {
    constexpr int BLOCK = 64, PITCH = DP + 8, KC = DP / 16, NT = DP / 8;
    /* K tile; V tile, which first stages the Q tile (16-byte aligned rows: PITCH * 2 bytes). */
    __shared__ coil_tile<BLOCK * PITCH> k_tile, v_tile;
    coil_u16 *sk = k_tile.e, *sv = v_tile.e;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int qblock = gridDim.y - 1 - blockIdx.y;
    const int row0 = qblock * BLOCK;
    const coil_u16 *qb = q + coil_batch_base(p.q, p.heads);
    const coil_u16 *kb = k + coil_batch_base(p.k, p.heads);
    const coil_u16 *vb = v + coil_batch_base(p.v, p.heads);
    coil_u16 *ob = o + coil_batch_base(p.o, p.heads);

    coil_tile_load<DP>(sv, qb, p.q.row, row0, p.l, p.d);
    coil_tile_load<DP>(sk, kb, p.k.row, 0, p.s, p.d);
    coil_cp_async_commit();
    coil_cp_async_wait<0>();
    __syncthreads();
    /* This warp's 16 query rows as A fragments, one per 16 columns of the head dim. */
    coil_u32 qf[KC][4];
    coil_a_frags<DP>(sv, warp * 16, qf);
    __syncthreads(); /* every warp holds its Q: the tile may take V */

    float acc[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
    /* Per thread, rows g and g + 8 of the warp's 16: running max (log2 units) and partial sum. */
    float row_max[2] = {COIL_NEG_INF, COIL_NEG_INF}, row_sum[2] = {0.f, 0.f};
    int kblocks = (p.s + BLOCK - 1) / BLOCK;
    if (p.causal) kblocks = coil_imin(kblocks, qblock + 1);
    for (int kbi = 0; kbi < kblocks; ++kbi) {
        const int key0 = kbi * BLOCK;
        coil_tile_load<DP>(sv, vb, p.v.row, key0, p.s, p.d);
        coil_cp_async_commit();

        /* S = Q K^T for 16 rows x 64 keys: 8 n-tiles of 8 keys. */
        float s[8][4];
#pragma unroll
        for (int j = 0; j < 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
        coil_mma_abt<DP, BF16>(s, qf, sk);
        __syncthreads(); /* every warp is done with the K tile */
        if (kbi + 1 < kblocks) coil_tile_load<DP>(sk, kb, p.k.row, key0 + BLOCK, p.s, p.d);
        coil_cp_async_commit(); /* empty on the last block: the waits below count alike */

        /* Scores in log2 units; keys past the end, and after the row when causal, are -inf. */
        const bool masked = key0 + BLOCK > p.s || (p.causal && key0 + BLOCK - 1 > row0);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float x = s[j][e] * p.scale_log2;
                if (masked) {
                    const int key = key0 + j * 8 + 2 * t + (e & 1);
                    const int row = row0 + warp * 16 + g + (e >> 1) * 8;
                    if (key >= p.s || (p.causal && key > row)) x = COIL_NEG_INF;
                }
                s[j][e] = x;
            }
        }
        /* Online softmax: new maximum, rescale what was accumulated, probabilities in place. */
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float mx = row_max[r];
#pragma unroll
            for (int j = 0; j < 8; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * r], s[j][2 * r + 1]));
            mx = coil_quad_max(mx);
            /* A row with no key yet: -inf - -inf would be NaN; every term is 0 anyway. */
            const float base = mx == COIL_NEG_INF ? 0.f : mx;
            const float alpha = coil_exp2(row_max[r] - base);
            row_max[r] = mx;
            float sum = 0.f;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
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

        coil_cp_async_wait<1>(); /* this thread's V copies landed (the next K's may not have) */
        __syncthreads();         /* ... and every thread's */
        coil_mma_ab<DP, BF16>(acc, s, sv); /* O += P V */
        coil_cp_async_wait<0>(); /* the next K tile landed */
        __syncthreads();         /* for every thread, and every warp is done with the V tile */
    }

    /* O / l, rounded once, stored two elements at a time through the output's strides; the
       logsumexp is max + log(sum), from log2 units. */
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const float total = coil_quad_sum(row_sum[r]);
        inv[r] = total > 0.f ? 1.f / total : 0.f;
        const int row = row0 + warp * 16 + g + r * 8;
        if (lse && t == 0 && row < p.l)
            lse[(long long)blockIdx.x * p.l + row] = total > 0.f ? (row_max[r] + coil_log2(total)) * COIL_LN2 : COIL_NEG_INF;
    }
    coil_store_rows<DP, BF16>(ob, p.o.row, row0 + warp * 16, p.l, p.d, acc, inv);
}

/* The simple kernel: 64 threads, one query row each; keys and values in blocks of 16 in shared
   memory (f32); any strides. */
template <int DP, int KIND>
COIL_D void coil_attention_simple(const void *q, const void *k, const void *v, void *o, float *lse, const CoilAttnParams &p) {
    constexpr int KEYS = 16;
    __shared__ float sk[KEYS][DP];
    __shared__ float sv[KEYS][DP];
    const int qblock = gridDim.y - 1 - blockIdx.y;
    const int row0 = qblock * 64, row = row0 + threadIdx.x;
    const long long qb = coil_batch_base(p.q, p.heads), kb = coil_batch_base(p.k, p.heads);
    const long long vb = coil_batch_base(p.v, p.heads), ob = coil_batch_base(p.o, p.heads);
    float qr[DP], acc[DP];
#pragma unroll
    for (int c = 0; c < DP; ++c) {
        qr[c] = row < p.l && c < p.d ? coil_att_load<KIND>(q, qb + row * p.q.row + c * p.q.col) * p.scale_log2 : 0.f;
        acc[c] = 0.f;
    }
    float row_max = COIL_NEG_INF, row_sum = 0.f;
    const int keys = p.causal ? coil_imin(p.s, row0 + 64) : p.s;
    for (int key0 = 0; key0 < keys; key0 += KEYS) {
        __syncthreads(); /* every thread is done with the previous block */
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
            sc[j] = key < p.s && !(p.causal && key > row) ? x : COIL_NEG_INF;
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
            const float pj = coil_exp2(sc[j] - base);
            row_sum += pj;
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

#define COIL_ATTENTION_MMA(NAME, DP, BF16)                                                                   \
    extern "C" __global__ void __launch_bounds__(128) NAME(const coil_u16 *q, const coil_u16 *k,              \
                                                           const coil_u16 *v, coil_u16 *o, float *lse,        \
                                                           CoilAttnParams p) {                                \
        coil_attention_mma<DP, BF16>(q, k, v, o, lse, p);                                                     \
    }
#define COIL_ATTENTION_SIMPLE(NAME, DP, KIND)                                                                \
    extern "C" __global__ void __launch_bounds__(64) NAME(const void *q, const void *k, const void *v,        \
                                                          void *o, float *lse, CoilAttnParams p) {            \
        coil_attention_simple<DP, KIND>(q, k, v, o, lse, p);                                                  \
    }
