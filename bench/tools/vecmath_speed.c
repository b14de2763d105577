/* Speed of the C prelude's f32 inverse trigonometry and erfinv (coil_codegen::c::vecmath)
   against the C library's, one core: each function over 4M f32 in an `omp simd` loop, best of 7,
   with the runtime's compiler flags.

   Any C file coil generates starts with the prelude; a debug dump writes them:

       COIL_DEBUG=/tmp/coil_dump cargo run --release --example quickstart
       cp "$(ls /tmp/coil_dump/*/*/kernels/*.c | head -1)" /tmp/kernels.c
       cc -O3 -march=native -ffp-contract=off -fno-math-errno -fno-trapping-math -fopenmp-simd \
          -DKERNELS='"/tmp/kernels.c"' bench/tools/vecmath_speed.c -o /tmp/vecmath_speed -lm
       /tmp/vecmath_speed

   It prints ns per element of each function; the checksums of a pair agree to f32 rounding. */
#include KERNELS
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define N (1 << 22)
static float x[N], y[N], out[N];

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define BENCH(name, expr)                                                                   \
    do {                                                                                    \
        double best = 1e9;                                                                  \
        for (int rep = 0; rep < 7; rep++) {                                                 \
            double t0 = now();                                                              \
            _Pragma("omp simd") for (int64_t i = 0; i < N; i++) out[i] = expr;              \
            double t = now() - t0;                                                          \
            if (t < best) best = t;                                                         \
        }                                                                                   \
        double s = 0;                                                                       \
        for (int64_t i = 0; i < N; i += 4096) s += out[i];                                  \
        printf("%-24s %6.2f ns/element (checksum %.6g)\n", name, best / N * 1e9, s);        \
    } while (0)

int main(void) {
    srand(1);
    for (int64_t i = 0; i < N; i++) {
        x[i] = (float)rand() / RAND_MAX * 2.0f - 1.0f; /* [-1, 1]: asin, acos, erfinv */
        y[i] = (float)rand() / RAND_MAX * 8.0f - 4.0f; /* [-4, 4] */
    }
    BENCH("coil_atan_f32", coil_atan_f32(y[i]));
    BENCH("atanf", atanf(y[i]));
    BENCH("coil_asin_f32", coil_asin_f32(x[i]));
    BENCH("asinf", asinf(x[i]));
    BENCH("coil_acos_f32", coil_acos_f32(x[i]));
    BENCH("acosf", acosf(x[i]));
    BENCH("coil_atan2_f32", coil_atan2_f32(x[i], y[i]));
    BENCH("atan2f", atan2f(x[i], y[i]));
    BENCH("coil_erfinv_f32", coil_erfinv_f32(x[i]));
    BENCH("coil_erfinv_f64 (scalar)", (float)coil_erfinv_f64((double)x[i]));
    BENCH("coil_tan_f32 (for scale)", coil_tan_f32(y[i]));
    return 0;
}
