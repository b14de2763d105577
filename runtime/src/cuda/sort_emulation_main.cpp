/* The runner of the argsort emulation (see sort_emulation.cpp): the launches
   coil_runtime::cuda::sort makes, on host memory, with small grids so that the kernels'
   grid-stride loops take several turns. */
int main(int argc, char **argv) {
    if (argc < 11) return 2;
    const std::string kernel = argv[1];
    const long long lines = std::atoll(argv[2]), len = std::atoll(argv[3]), inner = std::atoll(argv[4]);
    const long long tiles = std::atoll(argv[5]);
    const int width = std::atoi(argv[6]), threads = std::atoi(argv[7]), desc = std::atoi(argv[8]);
    std::vector<unsigned char> x = coil_emu_read(argv[9]);
    const size_t n = (size_t)(lines * len);
    std::vector<long long> out(n, -7);
    std::vector<coil_u64> keys[2] = {std::vector<coil_u64>(n, 0xdeadULL), std::vector<coil_u64>(n, 0xdeadULL)};
    std::vector<unsigned> pos[2] = {std::vector<unsigned>(n, 0xdead), std::vector<unsigned>(n, 0xdead)};
    const unsigned blocks = (unsigned)(lines * tiles < 3 ? lines * tiles : 3);
    const void *xp = x.data();
#define COIL_EMU_TILE(NAME, T)                                                                      \
    if (kernel == #NAME)                                                                            \
        coil_emu_launch(blocks, threads, [&] {                                                     \
            NAME((const T *)xp, keys[0].data(), pos[0].data(), out.data(), lines, len, inner, tiles, \
                 width, desc);                                                                      \
        });
    COIL_EMU_TILE(coil_sort_tile_f16, unsigned short)
    COIL_EMU_TILE(coil_sort_tile_bf16, unsigned short)
    COIL_EMU_TILE(coil_sort_tile_f32, unsigned int)
    COIL_EMU_TILE(coil_sort_tile_f64, coil_u64)
    COIL_EMU_TILE(coil_sort_tile_i64, long long)
    COIL_EMU_TILE(coil_sort_tile_i32, int)
    COIL_EMU_TILE(coil_sort_tile_i16, short)
    COIL_EMU_TILE(coil_sort_tile_i8, signed char)
    COIL_EMU_TILE(coil_sort_tile_u8, unsigned char)
    const int passes = argc - 11;
    for (int k = 0; k < passes; k++) {
        const long long run = std::atoll(argv[11 + k]);
        const int a = k % 2, b = (k + 1) % 2, last = k + 1 == passes;
        coil_emu_launch(2, 64, [&] {
            coil_sort_merge(keys[a].data(), pos[a].data(), keys[b].data(), pos[b].data(), out.data(), lines, len,
                            inner, run, last);
        });
    }
    FILE *f = std::fopen(argv[10], "wb");
    if (!f) return 3;
    std::fwrite(out.data(), 8, n, f);
    std::fclose(f);
    return 0;
}
