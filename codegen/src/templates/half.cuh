/* coil templates: the 16-bit float types and their conversions to and from f32, shared by every
   template that reads or writes f16 or bf16 (see codegen/src/templates/mod.rs). Round to
   nearest even, subnormals kept, overflow to inf. No headers: NVRTC has none here. With
   COIL_EMULATED defined, the conversions that are PTX instructions are left to the includer (the
   runtime's host emulation tests). */
typedef unsigned short coil_u16;
typedef unsigned int coil_u32;
#define COIL_D __device__ __forceinline__

#ifndef COIL_EMULATED
COIL_D float coil_f16_to_f32(coil_u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
COIL_D coil_u16 coil_f32_to_f16(float f) {
    coil_u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
#endif
/* A bf16 is the high half of an f32. */
COIL_D float coil_bf16_to_f32(coil_u16 h) { return __uint_as_float((coil_u32)h << 16); }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
COIL_D coil_u16 coil_f32_to_bf16(float f) {
    coil_u16 h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
#else
/* Before sm_80 (no cvt to bf16) and on the host: in integer arithmetic, a NaN as 0x7fc0. */
COIL_D coil_u16 coil_f32_to_bf16(float f) {
    const coil_u32 u = __float_as_uint(f);
    return f != f ? (coil_u16)0x7fc0 : (coil_u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
#endif
