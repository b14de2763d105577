/* Built-in activation kernels (see codegen/src/templates/activation.rs): gelu_tanh in place, one
   kernel per float dtype, in the order of the decomposition's ops; f16 / bf16 through f32.
   Follows half.cuh. */
#define COIL_GELU_TANH(T, x) (((x) * (T)0.5) * (tanh_of((((x) + (x) * (x) * (x) * (T)0.044715) * (T)0.7978845608028654)) + (T)1.0))
__device__ __forceinline__ float tanh_of(float x) { return tanhf(x); }
__device__ __forceinline__ double tanh_of(double x) { return tanh(x); }
__device__ __forceinline__ float gelu_f32(float x) { return COIL_GELU_TANH(float, x); }
extern "C" __global__ void coil_gelu_tanh_f32(float *x, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        x[i] = gelu_f32(x[i]);
}
extern "C" __global__ void coil_gelu_tanh_f64(double *x, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        x[i] = COIL_GELU_TANH(double, x[i]);
}
extern "C" __global__ void coil_gelu_tanh_f16(coil_u16 *x, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        x[i] = coil_f32_to_f16(gelu_f32(coil_f16_to_f32(x[i])));
}
extern "C" __global__ void coil_gelu_tanh_bf16(coil_u16 *x, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        x[i] = coil_f32_to_bf16(gelu_f32(coil_bf16_to_f32(x[i])));
}
/* The gradient of gelu_tanh at its saved input: g[i] *= gelu_tanh'(aux[i]), with
   t = tanh(c (x + 0.044715 x^3)): 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 * 0.044715 x^2)
   (Activation::grad_f32 on the host); f16 / bf16 through f32. */
template <typename T> __device__ __forceinline__ T gelu_tanh_grad(T x) {
    T t = tanh_of((x + x * x * x * (T)0.044715) * (T)0.7978845608028654);
    return (T)0.5 * ((T)1.0 + t) + (T)0.5 * x * ((T)1.0 - t * t) * (T)0.7978845608028654 * ((T)1.0 + (T)3.0 * (T)0.044715 * x * x);
}
__device__ __forceinline__ float gelu_grad_f32(float x) { return gelu_tanh_grad<float>(x); }
extern "C" __global__ void coil_gelu_tanh_grad_f32(float *g, const float *aux, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        g[i] = g[i] * gelu_grad_f32(aux[i]);
}
extern "C" __global__ void coil_gelu_tanh_grad_f64(double *g, const double *aux, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        g[i] = g[i] * gelu_tanh_grad<double>(aux[i]);
}
extern "C" __global__ void coil_gelu_tanh_grad_f16(coil_u16 *g, const coil_u16 *aux, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        g[i] = coil_f32_to_f16(coil_f16_to_f32(g[i]) * gelu_grad_f32(coil_f16_to_f32(aux[i])));
}
extern "C" __global__ void coil_gelu_tanh_grad_bf16(coil_u16 *g, const coil_u16 *aux, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        g[i] = coil_f32_to_bf16(coil_bf16_to_f32(g[i]) * gelu_grad_f32(coil_bf16_to_f32(aux[i])));
}
