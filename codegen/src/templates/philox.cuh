/* ---- Philox 4x32-10, exactly as coil_ir::philox (the C prelude and the CUDA kernels both) ------ */
/* The four words of the counter (lo32(block), hi32(block), tag, 0) under the key `seed`. */
COIL_D void coil_philox(uint64_t seed, uint64_t block, uint32_t tag, uint32_t w[4]) {
    uint32_t c0 = (uint32_t)block, c1 = (uint32_t)(block >> 32), c2 = tag, c3 = 0;
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
#pragma unroll
    for (int r = 0; r < 10; r++) {
        if (r > 0) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1;
        c3 = (uint32_t)p0;
        c0 = n0;
        c2 = n2;
    }
    w[0] = c0; w[1] = c1; w[2] = c2; w[3] = c3;
}
/* The uniform word of counter `index` (coil_ir::philox::uniform_word): word index % 4 of the
   uniform block index / 4 (counter word 2 is 1; the normal draws' blocks have 0). */
COIL_D uint32_t coil_uniform_word(uint64_t seed, uint64_t index) {
    uint32_t w[4];
    coil_philox(seed, index >> 2, 1u, w);
    return w[index & 3];
}
/* Uniform on [0, 1): (w >> 8) * 2^-24 of the uniform word, exact in every float dtype. */
COIL_D double coil_rand_uniform(uint64_t seed, uint64_t index) {
    return (double)(coil_uniform_word(seed, index) >> 8) * 5.9604644775390625e-8;
}
