// cuBLASLt's bias-gradient epilogues (BGRADA, DGELU_BGRAD) against the plain products on GPT-2's
// backward shapes (B*T = 8192, bf16 operands, f32 compute; weight gradients written in f32, as
// coil's training graphs write them). Prints each case's first heuristic algorithm and the best of
// the top 8 (median of 20 launches after 5, operands not flushed). On the GPU machine:
//   /usr/local/cuda/bin/nvcc -O2 -arch=sm_90 bench/tools/cublaslt_bgrad.cu -lcublasLt -o /tmp/bgrad && /tmp/bgrad
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <vector>
#include <algorithm>
#include <cuda_bf16.h>
#define CK(x) do { auto e = (x); if ((int)e) { printf("%s:%d error %d\n", __FILE__, __LINE__, (int)e); return -1; } } while (0)
__global__ void fill(__nv_bfloat16 *p, size_t n, unsigned s) { size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; if (i < n) { unsigned h = (unsigned)(i * 2654435761u) ^ s; p[i] = __float2bfloat16(((h >> 8) & 0xffff) / 65536.0f - 0.5f); } }
struct Case { const char *name; int m, n, k; cublasOperation_t ta, tb; cudaDataType_t dt; int epi; bool bias_f32; };
// column-major D[m x n] = op(A) op(B), k inner
float run(cublasLtHandle_t h, const Case &c, void *A, void *B, void *D, void *aux, void *bias, void *ws, size_t wsb, float *out_best, int *nalgo) {
  cublasLtMatmulDesc_t desc; cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &c.ta, 4);
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &c.tb, 4);
  if (c.epi) {
    cublasLtEpilogue_t e = (cublasLtEpilogue_t)c.epi; cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, 4);
    if (c.epi == CUBLASLT_EPILOGUE_DGELU || c.epi == CUBLASLT_EPILOGUE_DGELU_BGRAD) {
      int64_t ld = c.m; cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, 8);
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, 8);
    }
    if (c.epi != CUBLASLT_EPILOGUE_DGELU) {
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, 8);
      cudaDataType_t bt = c.bias_f32 ? CUDA_R_32F : CUDA_R_16BF; cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, 4);
    }
  }
  cublasLtMatrixLayout_t la, lb, ld;
  int ar = c.ta == CUBLAS_OP_N ? c.m : c.k, ac = c.ta == CUBLAS_OP_N ? c.k : c.m;
  int br = c.tb == CUBLAS_OP_N ? c.k : c.n, bc = c.tb == CUBLAS_OP_N ? c.n : c.k;
  cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, ar, ac, ar); cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, br, bc, br); cublasLtMatrixLayoutCreate(&ld, c.dt, c.m, c.n, c.m);
  cublasLtMatmulPreference_t pref; cublasLtMatmulPreferenceCreate(&pref);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, 8);
  cublasLtMatmulHeuristicResult_t res[8]; int n = 0;
  cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, ld, ld, pref, 8, res, &n); *nalgo = n;
  float best = 1e9, first = -1; cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  float alpha = 1, beta = 0;
  for (int a = 0; a < n; a++) {
    std::vector<float> t;
    for (int r = 0; r < 25; r++) {
      cudaEventRecord(e0);
      auto st = cublasLtMatmul(h, desc, &alpha, A, la, B, lb, &beta, D, ld, D, ld, &res[a].algo, ws, wsb, 0);
      cudaEventRecord(e1); cudaEventSynchronize(e1);
      if (st) { t.clear(); break; }
      float ms; cudaEventElapsedTime(&ms, e0, e1); if (r >= 5) t.push_back(ms * 1000);
    }
    if (t.empty()) continue;
    std::sort(t.begin(), t.end()); float med = t[t.size() / 2];
    if (first < 0) first = med; best = std::min(best, med);
  }
  *out_best = best; return first;
}
int main() {
  cublasLtHandle_t h; cublasLtCreate(&h);
  size_t big = 8192ull * 50304; void *A, *B, *D, *aux, *bias, *ws; size_t wsb = 32 << 20;
  cudaMalloc(&A, big * 2); cudaMalloc(&B, big * 2); cudaMalloc(&D, 8192ull * 3072 * 4); cudaMalloc(&aux, 8192ull * 3072 * 2); cudaMalloc(&bias, 1 << 20); cudaMalloc(&ws, wsb);
  fill<<<(big + 255) / 256, 256>>>((__nv_bfloat16 *)A, big, 1); fill<<<(big + 255) / 256, 256>>>((__nv_bfloat16 *)B, big, 2); fill<<<(8192 * 3072 + 255) / 256, 256>>>((__nv_bfloat16 *)aux, 8192ull * 3072, 3);
  cudaDeviceSynchronize();
  auto N = CUBLAS_OP_N, T = CUBLAS_OP_T;
  // dW = X^T dY as column-major D[nout x nin] = dY^T(A: nout x 8192, N) * X (B: T)
  Case cs[] = {
    {"dW fc1 3072x768 plain", 3072, 768, 8192, N, T, CUDA_R_32F, 0, true},
    {"dW fc1 3072x768 BGRADA f32", 3072, 768, 8192, N, T, CUDA_R_32F, CUBLASLT_EPILOGUE_BGRADA, true},
    {"dW fc1 3072x768 BGRADA bf16", 3072, 768, 8192, N, T, CUDA_R_32F, CUBLASLT_EPILOGUE_BGRADA, false},
    {"dW qkv 2304x768 plain", 2304, 768, 8192, N, T, CUDA_R_32F, 0, true},
    {"dW qkv 2304x768 BGRADA f32", 2304, 768, 8192, N, T, CUDA_R_32F, CUBLASLT_EPILOGUE_BGRADA, true},
    {"dW fc2 768x3072 plain", 768, 3072, 8192, N, T, CUDA_R_32F, 0, true},
    {"dW fc2 768x3072 BGRADA f32", 768, 3072, 8192, N, T, CUDA_R_32F, CUBLASLT_EPILOGUE_BGRADA, true},
    {"dW proj 768x768 plain", 768, 768, 8192, N, T, CUDA_R_32F, 0, true},
    {"dW proj 768x768 BGRADA f32", 768, 768, 8192, N, T, CUDA_R_32F, CUBLASLT_EPILOGUE_BGRADA, true},
    // dX of fc2 with dgelu: D[3072 x 8192] (bf16) = W2 (A: 3072x768, ld?) * dY^T
    {"dA fc DGELU bf16", 3072, 8192, 768, T, N, CUDA_R_16BF, CUBLASLT_EPILOGUE_DGELU, true},
    {"dA fc DGELU_BGRAD f32", 3072, 8192, 768, T, N, CUDA_R_16BF, CUBLASLT_EPILOGUE_DGELU_BGRAD, true},
    {"dA fc DGELU_BGRAD bf16", 3072, 8192, 768, T, N, CUDA_R_16BF, CUBLASLT_EPILOGUE_DGELU_BGRAD, false},
    {"dA fc plain bf16", 3072, 8192, 768, T, N, CUDA_R_16BF, 0, true},
  };
  for (auto &c : cs) { float best; int n; float first = run(h, c, A, B, D, aux, bias, ws, wsb, &best, &n); printf("%-32s algos %d first %8.1f us best %8.1f us\n", c.name, n, first, best); }
  return 0;
}
