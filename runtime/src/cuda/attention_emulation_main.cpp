/* The host runner of the attention emulation (runtime/src/cuda/attention_emulation.rs): reads
   the parameter struct (COIL_EMU_PARAMS) from params.bin and buffers b0.bin .. b<n-1>.bin from
   the directory argv[1] (an empty file is a null pointer), launches the grid (argv[2], argv[3])
   of argv[4] threads per block, one std::thread per CUDA thread, blocks one after the other
   (argv[5]: cp.async copies lazy), and writes every buffer back as r0.bin .. r<n-1>.bin. */
#include "module.cu"
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
static std::vector<char> coil_read(const std::string &path) {
    std::ifstream f(path, std::ios::binary);
    return std::vector<char>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}
/* 64-byte aligned copies, as device allocations are (256). */
static char *coil_aligned(const std::vector<char> &bytes) {
    char *p = (char *)std::aligned_alloc(64, (bytes.size() + 63) / 64 * 64);
    std::memcpy(p, bytes.data(), bytes.size());
    return p;
}
int main(int argc, char **argv) {
    if (argc != 7) return 2;
    const std::string dir = argv[1];
    const unsigned gx = std::atoi(argv[2]), gy = std::atoi(argv[3]), block = std::atoi(argv[4]);
    coil_emu_lazy = std::atoi(argv[5]) != 0;
    const int n = std::atoi(argv[6]);
    std::vector<char> pb = coil_read(dir + "/params.bin");
    if (pb.size() != sizeof(COIL_EMU_PARAMS)) {
        std::fprintf(stderr, "params: %zu bytes, want %zu\n", pb.size(), sizeof(COIL_EMU_PARAMS));
        return 3;
    }
    COIL_EMU_PARAMS p;
    std::memcpy(&p, pb.data(), sizeof p);
    std::vector<std::vector<char>> bytes(n);
    std::vector<char *> buf(n);
    for (int i = 0; i < n; ++i) {
        bytes[i] = coil_read(dir + "/b" + std::to_string(i) + ".bin");
        buf[i] = bytes[i].empty() ? nullptr : coil_aligned(bytes[i]);
    }
    gridDim = {gx, gy, 1};
    blockDim = {block, 1, 1};
    for (unsigned y = 0; y < gy; ++y) {
        for (unsigned x = 0; x < gx; ++x) {
            blockIdx = {x, y, 0};
            /* Shared memory a block reads before writing would be NaN (0xffff halves and floats). */
            std::memset(coil_emu_dynamic_shared, 0xff, sizeof coil_emu_dynamic_shared);
            CoilEmuBarrier bar(block);
            coil_emu_block = &bar;
            std::vector<std::unique_ptr<CoilEmuBarrier>> warps;
            for (unsigned w = 0; w < block / 32; ++w) {
                warps.push_back(std::make_unique<CoilEmuBarrier>(32));
                coil_emu_warps[w].bar = warps.back().get();
            }
            std::vector<std::thread> threads;
            for (unsigned i = 0; i < block; ++i)
                threads.emplace_back([&, i] {
                    threadIdx = {i, 0, 0};
                    COIL_EMU_CALL;
                });
            for (std::thread &t : threads) t.join();
        }
    }
    for (int i = 0; i < n; ++i)
        if (buf[i]) std::ofstream(dir + "/r" + std::to_string(i) + ".bin", std::ios::binary).write(buf[i], bytes[i].size());
    return 0;
}
