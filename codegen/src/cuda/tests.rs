//! The generated CUDA: snapshots of the classic kernels (read them by eye), the launch
//! heuristic, and a syntax check with the host C++ compiler, which sees the source through a
//! harness that declares the CUDA built-ins (no GPU here; the runtime's tests run it).

use super::*;
use crate::testutil::*;
use crate::tile::build_kernel;
use crate::tile::tests::{online, Online};
use coil_ir::kernel::FusedKernel;
use coil_ir::loops::{BufferId, LoopProgram, ScalarOp};
use coil_ir::sym::Expr;
use coil_ir::{BinaryOp, DType, ReduceOp, UnaryOp};
use std::process::Command;

fn snapshot(name: &str, text: String) {
    insta::with_settings!({ snapshot_path => "../snapshots", prepend_module_to_snapshot => false }, {
        insta::assert_snapshot!(name, text);
    });
}

/// The tile kernel of `k`, renamed (several sizes of one pattern share a module).
fn tile(p: &LoopProgram, k: &FusedKernel, name: &str) -> TileKernel {
    let mut t = build_kernel(p, k);
    t.name = name.to_string();
    t
}

/// The two reductions of a variance of f32 `x` (element `index` of output `xs(&[outs])[0]` at
/// reduced position `rs(&[red])[0]`): the mean, then the sum of squared deviations from it.
fn mean_and_squares(p: &mut Prog, x: BufferId, index: Expr, outs: usize, red: usize) -> (BufferId, BufferId) {
    let f = DType::F32;
    let xv = xs(&[outs])[0];
    let mut b = B::default();
    let l = b.load(x, index, f);
    let sum = p.reduction(&[outs], &[red], ReduceOp::Sum, f, b.done(l));
    let mut b = B::default();
    let (s, n) = (b.load(sum, xv, f), b.constant(red as f64, f));
    let q = b.binary(BinaryOp::Div, s, n, f);
    let mean = p.pointwise(&[outs], f, b.done(q));
    let mut b = B::default();
    let (l, m) = (b.load(x, index, f), b.load(mean, xv, f));
    let d = b.binary(BinaryOp::Sub, l, m, f);
    let sq = b.binary(BinaryOp::Mul, d, d, f);
    (mean, p.reduction(&[outs], &[red], ReduceOp::Sum, f, b.done(sq)))
}

/// `layer_norm(x, [cols], w, b, eps=1e-5)` of f32 `[rows, cols]` as lowering produces it:
/// two row sums, per-row epilogues, and the normalizing per-element epilogue with broadcast
/// weights.
pub(crate) fn layer_norm(rows: usize, cols: usize, kind: KernelKind) -> (LoopProgram, FusedKernel) {
    let f = DType::F32;
    let mut p = Prog::default();
    let x = p.input(&[rows, cols], f);
    let w = p.input(&[cols], f);
    let bias = p.input(&[cols], f);
    let (xv, rv) = (xs(&[rows])[0], rs(&[cols])[0]);
    let (mean, ss) = mean_and_squares(&mut p, x, xv * cols as i64 + rv, rows, cols);
    let mut b = B::default();
    let (s, n, eps) = (b.load(ss, xv, f), b.constant(cols as f64, f), b.constant(1e-5, f));
    let q = b.binary(BinaryOp::Div, s, n, f);
    let a = b.binary(BinaryOp::Add, q, eps, f);
    let r = b.unary(UnaryOp::Rsqrt, a, f);
    let rstd = p.pointwise(&[rows], f, b.done(r));
    let v = xs(&[rows, cols]);
    let mut b = B::default();
    let (l, m, r) = (b.load(x, v[0] * cols as i64 + v[1], f), b.load(mean, v[0], f), b.load(rstd, v[0], f));
    let d = b.binary(BinaryOp::Sub, l, m, f);
    let y = b.binary(BinaryOp::Mul, d, r, f);
    let (wl, bl) = (b.load(w, v[1], f), b.load(bias, v[1], f));
    let y = b.binary(BinaryOp::Mul, y, wl, f);
    let y = b.binary(BinaryOp::Add, y, bl, f);
    let out = p.pointwise(&[rows, cols], f, b.done(y));
    p.output(out);
    (p.p, kernel("per_fused_layer_norm_0", kind, vec![0, 1, 2, 3, 4], rows, Some(cols), vec![out]))
}

/// `relu(x * 2 + 1)` over `n` elements of `d`, stored as `d` and (the same values) as f32.
pub(crate) fn pointwise_n(n: usize, d: DType) -> (LoopProgram, FusedKernel) {
    let mut p = Prog::default();
    let x = p.input(&[n], d);
    let v = xs(&[n])[0];
    let mut outs = Vec::new();
    for od in [d, DType::F32] {
        let mut b = B::default();
        let l = b.load(x, v, d);
        let (two, one, zero) = (b.constant(2.0, d), b.constant(1.0, d), b.constant(0.0, d));
        let m = b.binary(BinaryOp::Mul, l, two, d);
        let a = b.binary(BinaryOp::Add, m, one, d);
        let r = b.binary(BinaryOp::Maximum, a, zero, d);
        let c = b.push(ScalarOp::Cast(r), od);
        outs.push(p.pointwise(&[n], od, b.done(c)));
    }
    (p.p, kernel("poi_fused_relu_0", KernelKind::Pointwise, vec![0, 1], n, None, outs))
}

/// Declarations that let the host C++ compiler check the syntax and types of generated CUDA.
const HARNESS: &str = r#"
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)
#define __cluster_dims__(...)
struct coil_dim3 { unsigned x, y, z; };
extern coil_dim3 threadIdx, blockIdx, blockDim, gridDim;
void __syncthreads();
template <typename T> T __shfl_down_sync(unsigned mask, T v, unsigned delta);
template <typename T> T __shfl_sync(unsigned mask, T v, int lane);
unsigned long long atomicCAS(unsigned long long *p, unsigned long long cmp, unsigned long long val);
float __int_as_float(int);
float __uint_as_float(unsigned);
unsigned __float_as_uint(float);
float __fadd_rn(float, float);
#define F1(n) float n##f(float); double n(double);
#define F2(n) float n##f(float, float); double n(double, double);
F1(fabs) F1(exp) F1(exp2) F1(expm1) F1(log) F1(log2) F1(log1p) F1(sqrt) F1(sin) F1(cos) F1(tan)
F1(tanh) F1(erf) F1(floor) F1(ceil) F1(nearbyint) F1(trunc) F1(atan) F1(asin) F1(acos) F1(erfinv) F1(erfc)
F2(fmod) F2(copysign) F2(pow) F2(atan2)
"#;

/// Checks `src` with `g++ -fsyntax-only` through [`HARNESS`]; skipped without a host `g++`.
pub(crate) fn syntax_check(src: &str) {
    let dir = std::env::temp_dir().join(format!("coil-cuda-syntax-{}-{}", std::process::id(), fastrand()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("harness.h"), HARNESS).unwrap();
    std::fs::write(dir.join("module.cu"), src).unwrap();
    let out = Command::new("g++")
        .args([
            "-std=c++17",
            "-fsyntax-only",
            "-Wall",
            "-Wno-unused",
            "-Wno-unknown-pragmas",
            "-Werror",
            "-include",
            "harness.h",
            "-x",
            "c++",
        ])
        .arg("module.cu")
        .current_dir(&dir)
        .output();
    let _ = std::fs::remove_dir_all(&dir);
    match out {
        Err(e) => coil_ir::testing::skip(format!("the CUDA C syntax check: no g++ ({e})")),
        Ok(o) => assert!(o.status.success(), "g++ rejected the CUDA source:\n{}", String::from_utf8_lossy(&o.stderr)),
    }
}

/// A distinct number per call (test threads run concurrently).
fn fastrand() -> usize {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// Every test pattern at several sizes (vector and scalar groups, warp and block rows, looped
/// rows, partial groups), named apart: the module that the syntax check compiles and the GPU
/// check runs.
pub(crate) fn all_kernels() -> Vec<TileKernel> {
    let mut v = Vec::new();
    for (n, d, name) in [
        (32, DType::BF16, "poi_bf16_32"),
        ((1 << 20) + 3, DType::BF16, "poi_bf16_big"),
        (4099, DType::F32, "poi_f32_4099"),
    ] {
        let (p, k) = pointwise_n(n, d);
        v.push(tile(&p, &k, name));
    }
    for (r, c) in [(5, 8), (300, 256), (64, 1000), (7, 1024), (9, 333), (3, 2000), (4, 4099)] {
        let kind = if c <= 1024 { KernelKind::PersistentReduction } else { KernelKind::LoopedReduction };
        let (p, k) = softmax(r, c, kind, "softmax");
        v.push(tile(&p, &k, &format!("softmax_{r}x{c}")));
    }
    // column reductions (persistent, looped) and a long persistent row, as the GPU schedules them
    for (r, c, kind) in [
        (64, 256, KernelKind::PersistentReduction),
        (8192, 64, KernelKind::PersistentReduction),
        (3000, 96, KernelKind::LoopedReduction),
    ] {
        let (p, k) = col_sum(r, c, kind);
        v.push(tile(&p, &k, &format!("col_sum_{r}x{c}")));
    }
    let (p, k) = col_mean(37, 8192);
    v.push(tile(&p, &k, "col_mean_37x8192"));
    let (p, k) = softmax(16, 8192, KernelKind::PersistentReduction, "softmax");
    v.push(tile(&p, &k, "softmax_persistent_16x8192"));
    // rows split over a cluster of blocks (sm_90): a partial last chunk, and a whole one
    for (r, c) in [(3, 12289), (1024, 1 << 16)] {
        let (p, k) = softmax(r, c, KernelKind::PersistentReduction, "softmax");
        v.push(tile(&p, &k, &format!("softmax_cluster_{r}x{c}")));
    }
    let (p, k) = layer_norm(5, 20000, KernelKind::PersistentReduction);
    v.push(tile(&p, &k, "layer_norm_cluster_5x20000"));
    for (r, c) in [(37, 768), (5, 3000), (3, 5)] {
        let kind = if c <= 1024 { KernelKind::PersistentReduction } else { KernelKind::LoopedReduction };
        let (p, k) = layer_norm(r, c, kind);
        v.push(tile(&p, &k, &format!("layer_norm_{r}x{c}")));
    }
    // big ones, for timing on the GPU
    let (p, k) = pointwise_n(1 << 26, DType::BF16);
    v.push(tile(&p, &k, "poi_bf16_64m"));
    for (r, c) in [(65536, 1024), (262144, 256), (8192, 8192)] {
        let kind = if c <= 1024 { KernelKind::PersistentReduction } else { KernelKind::LoopedReduction };
        let (p, k) = softmax(r, c, kind, "softmax");
        v.push(tile(&p, &k, &format!("softmax_{r}x{c}")));
    }
    for c in [5, 300, 1500] {
        let (p, k) = crate::tile::tests::argmax(4, c);
        v.push(tile(&p, &k, &format!("argmax_4x{c}")));
    }
    let (p, k) = crate::tile::tests::embedding();
    v.push(tile(&p, &k, "embedding"));
    let (p, k) = crate::tile::tests::cache_write();
    v.push(tile(&p, &k, "cache_write"));
    let (p, k) = crate::tile::tests::cache_write_of("bf16", 8, 256, 16, 64);
    v.push(tile(&p, &k, "cache_write_bf16"));
    let (p, k) = signed_zeros();
    v.push(tile(&p, &k, "signed_zeros"));
    let (p, k) = crate::tile::tests::pointwise_chain(DType::F16);
    v.push(tile(&p, &k, "poi_f16_chain"));
    for (kind, c) in [(KernelKind::PersistentReduction, 6), (KernelKind::LoopedReduction, 1500)] {
        let (p, k) = crate::tile::tests::mean_var(kind, c);
        v.push(tile(&p, &k, &format!("mean_var_{c}")));
    }
    // online softmax passes: each result kind, f64, bf16, a column plan, long rows for timing
    for (what, cols, d, transposed) in online_cases() {
        let (p, k) = online(64, cols, d, what, transposed);
        let name = format!("online_{what:?}_{d}_{}{}", cols.map_or("s0".into(), |c| c.to_string()), transposed);
        v.push(tile(&p, &k, &name.to_lowercase()));
    }
    v
}

/// The online softmax kernels of [`all_kernels`]: `(what, row length, input dtype, transposed)`.
fn online_cases() -> Vec<(Online, Option<usize>, DType, bool)> {
    vec![
        (Online::LogSoftmax, Some(3000), DType::F32, false),
        (Online::LogSumExp, Some(50304), DType::F32, false),
        (Online::Stats, Some(2000), DType::F64, false),
        (Online::Softmax, Some(65536), DType::BF16, false),
        (Online::Softmax, None, DType::F32, false),
        (Online::LogSumExp, Some(3000), DType::F16, true),
    ]
}

#[test]
fn pointwise_bf16_vectorized() {
    let (p, k) = crate::tile::tests::pointwise_chain(DType::BF16);
    let t = build_kernel(&p, &k);
    let (src, launch) = emit_cuda_kernel(&t).unwrap();
    // 32 bf16: 4 groups of 8, one 16-byte load and store each, one warp
    assert_eq!(launch, Launch { grid: 1, block: 32, shared_bytes: 0, per_block: 256, max_grid: 0, cluster: 1 });
    assert!(src.contains("coil_load<uint16_t, 8, 8>(in_ptr0 + (8*xvec), aligned)"), "{src}");
    // stored from f32 values, rounded in pairs (one cvt.rn.bf16x2.f32 each)
    assert!(src.contains("coil_store_bf16<8, 8>(out_ptr0 + (8*xvec), s"), "{src}");
    snapshot("cuda_pointwise_bf16", src);
    // a tail: the partial group goes element by element
    let (p, k) = pointwise_n(4099, DType::F32);
    let (src, launch) = emit_cuda_kernel(&build_kernel(&p, &k)).unwrap();
    assert_eq!((launch.grid, launch.block), (5, 256));
    assert!(src.contains("if (xvec < 1024) {") && src.contains("if (xindex >= xnumel) break;"), "{src}");
    // 1025 groups, 1280 threads: no grid-stride loop, the extra threads skip the body
    assert!(
        src.contains("const int xvec = (int)blockIdx.x * blockDim.x + threadIdx.x;\n    if (xvec < 1025) {"),
        "{src}"
    );
}

#[test]
fn softmax_persistent_warp_per_row() {
    let (p, k) = softmax(32, 128, KernelKind::PersistentReduction, "per_fused_softmax_0");
    let (src, launch) = emit_cuda_kernel(&build_kernel(&p, &k)).unwrap();
    // 128 f32 per row: a warp, one 16-byte group per lane; 32 rows: one row per block
    assert_eq!(launch, Launch { grid: 32, block: 32, shared_bytes: 0, per_block: 1, max_grid: 0, cluster: 1 });
    assert!(src.contains("coil_reduce<1>(acc1, coil_max_f32(), smem1)"), "{src}");
    // x is loaded once: the later passes read it from registers
    assert_eq!(src.matches("coil_load<").count(), 1, "{src}");
    snapshot("cuda_softmax_persistent", src);
}

#[test]
fn a_unit_gets_only_the_helpers_it_uses() {
    let (p, k) = softmax(32, 3000, KernelKind::LoopedReduction, "red_fused_softmax_0");
    let module = emit_cuda(&[build_kernel(&p, &k)]).unwrap();
    let src = &module.source;
    // what the kernel calls, and what those call in turn
    for used in ["coil_exp_f32(", "coil_reduce_costly<", "coil_online_group<", "coil_shfl_down(", "coil_div_f32("] {
        assert!(src.contains(used), "{used} missing:\n{src}");
    }
    // nothing it does not: random numbers, f64 floor division, arg reductions
    for unused in ["coil_philox(", "coil_floordiv_f64(", "coil_argbest", "coil_store_half<"] {
        assert!(!src.contains(unused), "{unused} kept:\n{src}");
    }
    // well under the whole prelude
    assert!(src.len() * 3 < prelude().len() * 2, "{} of {} bytes", src.len(), prelude().len());
    syntax_check(src);
}

/// A dropout-like kernel drawing from random streams 0 and 3: their keys and first counters are
/// parameters after the sizes, named as the streams' arguments, read by the Philox calls.
#[test]
fn random_streams_are_parameters() {
    let mut p = Prog::default();
    let x = p.input(&[4096], DType::F32);
    let v = xs(&[4096])[0];
    let mut b = B::default();
    let l = b.load(x, v, DType::F32);
    let u = b.push(ScalarOp::Rand { dist: coil_ir::RandDist::Uniform, stream: 3, counter: v + 4096 }, DType::F32);
    let n = b.push(ScalarOp::Rand { dist: coil_ir::RandDist::Normal, stream: 0, counter: v }, DType::F32);
    let s = b.binary(BinaryOp::Add, u, n, DType::F32);
    let y = b.binary(BinaryOp::Mul, l, s, DType::F32);
    let out = p.pointwise(&[4096], DType::F32, b.done(y));
    let k = kernel("poi_fused_rand_0", KernelKind::Pointwise, vec![0], 4096, None, vec![out]);
    let t = build_kernel(&p.p, &k);
    assert_eq!(t.random, vec![0, 3]);
    let (src, _) = emit_cuda_kernel(&t).unwrap();
    assert!(
        src.contains("uint64_t seed0, uint64_t offset0, uint64_t seed3, uint64_t offset3, int64_t *status)"),
        "{src}"
    );
    assert!(src.contains("coil_rand_uniform(seed3, offset3 + (uint64_t)("), "{src}");
    assert!(src.contains("coil_rand_normal(seed0, offset0 + (uint64_t)("), "{src}");
    // small relative counters: 32-bit index arithmetic
    assert!(src.contains("const int xnumel"), "{src}");
    syntax_check(&emit_cuda(&[t]).unwrap().source);
}

#[test]
fn softmax_looped() {
    let (p, k) = softmax(3, 2000, KernelKind::LoopedReduction, "red_fused_softmax_0");
    let (src, launch) = emit_cuda_kernel(&build_kernel(&p, &k)).unwrap();
    // two passes over rows of 8000 bytes: at most 24 MiB of rows in flight, 23 per SM
    assert_eq!(launch, Launch { grid: 3, block: 256, shared_bytes: 0, per_block: 1, max_grid: 3036, cluster: 1 });
    // small sizes: 32-bit index arithmetic
    assert!(src.contains("for (int rchunk = rlane; rchunk < 500; rchunk += 256) {"), "{src}");
    snapshot("cuda_softmax_looped", src);
}

#[test]
fn layer_norm_block_per_row() {
    let (p, k) = layer_norm(37, 1536, KernelKind::PersistentReduction);
    let (src, launch) = emit_cuda_kernel(&build_kernel(&p, &k)).unwrap();
    // 1536 f32: 384 groups of 4, two on each of 192 threads (6 warps, a shared-memory stage)
    assert_eq!(launch, Launch { grid: 37, block: 192, shared_bytes: 0, per_block: 1, max_grid: 0, cluster: 1 });
    assert!(src.contains("coil_reduce<6>(") && !src.contains("if (rchunk <"), "{src}");
    // the weights are contiguous along the row: vector loads too
    assert_eq!(src.matches("coil_load<float, 4, 4>").count(), 3, "{src}");
    snapshot("cuda_layer_norm", src);
}

#[test]
fn argmax_pairs() {
    let (p, k) = crate::tile::tests::argmax(4, 5);
    let (src, _) = emit_cuda_kernel(&build_kernel(&p, &k)).unwrap();
    assert!(src.contains("coil_arg<float> acc1 = coil_arg<float>{-INFINITY, COIL_NO_INDEX};"), "{src}");
    snapshot("cuda_argmax", src);
}

#[test]
fn embedding_checks_bounds() {
    let (p, k) = crate::tile::tests::embedding();
    let (src, _) = emit_cuda_kernel(&build_kernel(&p, &k)).unwrap();
    assert!(src.contains("coil_index_error(status, "), "{src}");
    snapshot("cuda_embedding", src);
}

/// A cache write checks its window once per thread, before its groups, moves the cache's
/// pointer to it and stores like a plain pointwise kernel: a vector store per group.
#[test]
fn scatter_store_checks_its_window_once_and_stores_vectors() {
    let (p, k) = crate::tile::tests::cache_write();
    let (src, _) = emit_cuda_kernel(&build_kernel(&p, &k)).unwrap();
    assert_eq!(src.matches("coil_fail(status, 1, ").count(), 1, "{src}");
    assert!(src.contains("out_ptr0 += (4)*tmp2;"), "{src}");
    assert!(src.contains("coil_store<float, 4, 4>(out_ptr0 + "), "{src}");
    snapshot("cuda_cache_write", src);
}

/// The cache write of a Llama layer (bf16, head_dim 64, 16 new positions): the launch plan and
/// the stores of a plain pointwise kernel writing the same contiguous output (8 bf16 per
/// thread, one 16-byte store); a window whose rows are no multiple of the pieces (5 f32)
/// keeps scalar stores, as its moved pointer may not be 16-byte aligned.
#[test]
fn scatter_store_gets_the_plan_and_vector_stores_of_a_plain_pointwise_kernel() {
    let (p, k) = crate::tile::tests::cache_write_of("bf16", 8, 256, 16, 64);
    let t = build_kernel(&p, &k);
    let (src, _) = emit_cuda_kernel(&t).unwrap();
    // the same kernel without the window: a plain store into a contiguous output
    let mut plain = t.clone();
    plain.body.retain(|s| !matches!(s, TileStmt::Window { .. }));
    let plan = launch::plan(&t, &GpuTarget::h100());
    assert_eq!(plan, launch::plan(&plain, &GpuTarget::h100()));
    assert_eq!((plan.vec, plan.launch.block), (8, 256));
    assert!(src.contains("coil_store_bf16<8, 8>(out_ptr0 + "), "{src}");
    assert!(!src.contains("out_ptr0["), "no scalar store\n{src}");
    let (p, k) = crate::tile::tests::cache_write_of("f32", 2, 8, 3, 5);
    let (src, _) = emit_cuda_kernel(&build_kernel(&p, &k)).unwrap();
    assert!(!src.contains("coil_store<"), "{src}");
    assert!(src.contains("out_ptr0["), "{src}");
}

/// `x.sum(dim=0)` of f32 `[rows, cols]`: a reduction down the columns (`x[cols*r + x]`).
pub(crate) fn col_sum(rows: usize, cols: usize, kind: KernelKind) -> (LoopProgram, FusedKernel) {
    sum_dim(rows, cols, 0, kind)
}

#[test]
fn one_block_kernels_keep_their_chunk_loop() {
    // one row of 8192 f32: one block of 1024 threads, 2 chunks of 4 each; a latency-bound tail
    // whose chunk loop stays a loop (less NVRTC time); with rows for many blocks (256 threads,
    // 8 chunks) it unrolls
    for (rows, block, chunks, want) in [(1, 1024, 2, "#pragma unroll 1\n"), (300, 256, 8, "#pragma unroll\n")] {
        let (p, k) = sum_dim(rows, 8192, 1, KernelKind::PersistentReduction);
        let (src, launch) = emit_cuda_kernel(&build_kernel(&p, &k)).unwrap();
        assert_eq!((launch.grid, launch.block), (rows as u32, block));
        let at = src.find(&format!("for (int k = 0; k < {chunks}; k++)")).expect("a chunk loop");
        assert!(src[..at].ends_with(&format!("        {want}        ")), "{want:?} before the chunk loop in\n{src}");
    }
}

#[test]
fn column_reduction_coalesces() {
    let (p, k) = col_sum(64, 256, KernelKind::PersistentReduction);
    let t = build_kernel(&p, &k);
    assert!(launch::column_like(&t));
    let (src, launch) = emit_cuda_kernel(&t).unwrap();
    // 32 outputs per block (one per lane) times 8 threads along the 64 rows, 8 rows each
    assert_eq!(launch, Launch { grid: 8, block: 256, shared_bytes: 0, per_block: 32, max_grid: 0, cluster: 1 });
    assert!(src.contains("const int rlane = threadIdx.x / 32;"), "{src}");
    assert!(src.contains("xindex = (int)blockIdx.x * 32 + threadIdx.x % 32;"), "{src}");
    assert!(src.contains("coil_reduce_col<8, 32>(acc1, coil_add(), smem1)"), "{src}");
    // rows (contiguous along r) keep the row plan
    let (p, k) = softmax(64, 256, KernelKind::PersistentReduction, "s");
    let t = build_kernel(&p, &k);
    assert!(!launch::column_like(&t));
    // outputs not a multiple of 32: the row plan (its barriers need whole blocks)
    let (p, k) = col_sum(64, 100, KernelKind::PersistentReduction);
    assert!(!launch::column_like(&build_kernel(&p, &k)));
    // the first stage of a split column sum: outputs `[chunks, cols]`, each reading its chunk of
    // rows down a column (`x[cols*(chunk*s + r) + c]`, `xindex = cols*s + c`); the 32 outputs
    // of a block are consecutive columns of one chunk
    let (chunks, rows, cols) = (8, 64, 96);
    let f = DType::F32;
    let mut prog = Prog::default();
    let x = prog.input(&[chunks * rows, cols], f);
    let [sv, cv] = xs(&[chunks, cols])[..] else { unreachable!() };
    let rv = rs(&[rows])[0];
    let mut b = B::default();
    let l = b.load(x, (sv * rows as i64 + rv) * cols as i64 + cv, f);
    let s = prog.reduction(&[chunks, cols], &[rows], ReduceOp::Sum, f, b.done(l));
    prog.output(s);
    let k = kernel("per_fused_sum_0", KernelKind::PersistentReduction, vec![0], chunks * cols, Some(rows), vec![s]);
    assert!(launch::column_like(&build_kernel(&prog.p, &k)));
}

/// `(x * rstd[:, None]).sum(0)` of f32 `x: [rows, cols]`, `rstd: [rows]` (a layer norm's
/// weight gradient): the per-row value is contiguous along the reduced dim but the same for
/// every output, so the kernel still reads down columns.
#[test]
fn a_column_reduction_with_a_per_row_operand_coalesces() {
    let (rows, cols) = (256usize, 768usize);
    let f = DType::F32;
    let mut p = Prog::default();
    let (x, rstd) = (p.input(&[rows, cols], f), p.input(&[rows], f));
    let (xv, rv) = (xs(&[cols])[0], rs(&[rows])[0]);
    let mut b = B::default();
    let (l, r) = (b.load(x, rv * cols as i64 + xv, f), b.load(rstd, rv, f));
    let m = b.binary(BinaryOp::Mul, l, r, f);
    let sum = p.reduction(&[cols], &[rows], ReduceOp::Sum, f, b.done(m));
    p.output(sum);
    let k = kernel("per_fused_mul_sum_0", KernelKind::PersistentReduction, vec![0], cols, Some(rows), vec![sum]);
    assert!(launch::column_like(&build_kernel(&p.p, &k)));
}

/// `(2 * x).sum(0) / rows + bias` of f32 `[rows, cols]`: a column reduction with a constant
/// before its pass and row statements after it.
pub(super) fn col_mean(rows: usize, cols: usize) -> (LoopProgram, FusedKernel) {
    let f = DType::F32;
    let mut p = Prog::default();
    let (x, bias) = (p.input(&[rows, cols], f), p.input(&[cols], f));
    let (xv, rv) = (xs(&[cols])[0], rs(&[rows])[0]);
    let mut b = B::default();
    let (l, two) = (b.load(x, rv * cols as i64 + xv, f), b.constant(2.0, f));
    let m = b.binary(BinaryOp::Mul, l, two, f);
    let sum = p.reduction(&[cols], &[rows], ReduceOp::Sum, f, b.done(m));
    let mut b = B::default();
    let (s, n, bl) = (b.load(sum, xv, f), b.constant(rows as f64, f), b.load(bias, xv, f));
    let q = b.binary(BinaryOp::Div, s, n, f);
    let y = b.binary(BinaryOp::Add, q, bl, f);
    let out = p.pointwise(&[cols], f, b.done(y));
    p.output(out);
    (p.p, kernel("per_fused_col_mean_0", KernelKind::PersistentReduction, vec![0, 1], cols, Some(rows), vec![out]))
}

#[test]
fn wide_column_reduction_takes_vectors_of_outputs() {
    // 8192 outputs: 128 blocks of 64, each thread 4 consecutive outputs, one 16-byte load per
    // reduced position, an accumulator per output; then one shared-memory stage, and each
    // output's fold and row statements in a thread of its own
    let (p, k) = col_mean(300, 8192);
    let t = build_kernel(&p, &k);
    assert!(launch::single_pass(&t));
    let pl = launch::plan(&t, &GpuTarget::h100());
    assert_eq!((pl.col_vec, pl.col_threads(), pl.lanes, pl.chunks, pl.launch.grid), (4, 16, 64, 5, 128));
    let (src, _) = emit_cuda_kernel(&t).unwrap();
    for want in [
        // 128 blocks of 16 groups cover the 2048 groups of 4 outputs: no grid-stride loop
        "const int xg = (int)blockIdx.x * 16 + threadIdx.x % 16;\n    {",
        "coil_load<float, 4, 4>(in_ptr0 + (8192*rchunk + 4*xg), aligned)",
        "if (rchunk < 300) {",
        "acc5[i] = coil_add()(acc5[i], tmp4);",
        // 4 planes of 1024 slots; the threads at rlane 0..3 fold one output each, once
        "__shared__ float smem5[4096];",
        "coil_col_stage<4>(acc5, smem5);",
        "if (rlane < 4) {",
        "const int xindex = 4 * xg + rlane;",
        "coil_col_fold<64, 16>(smem5 + rlane * 1024, coil_add())",
        // the bias, a row value the pass does not read, is loaded per output after it
        "const float tmp2 = in_ptr1[xindex];",
        "    out_ptr0[xindex] = tmp7;",
    ] {
        assert!(src.contains(want), "{want} not in\n{src}");
    }
    snapshot("cuda_col_mean_vectors", src.clone());
    syntax_check(&format!("{}\n{src}", prelude()));
    // fewer outputs, or two passes (layer norm: its second pass reads the first's sum), keep
    // one output per thread
    let (p, k) = col_mean(300, 4096);
    assert_eq!(launch::plan(&build_kernel(&p, &k), &GpuTarget::h100()).col_vec, 1);
    let (p, k) = layer_norm(37, 768, KernelKind::PersistentReduction);
    assert!(!launch::single_pass(&build_kernel(&p, &k)));
}

#[test]
fn broadcast_operand_is_one_vector_load_and_wide_kernels_keep_64_bit() {
    // bias[xindex % cols]: `8*xvec % cols` once per group, one vector load, no `%` per element
    let f = DType::BF16;
    let mut p = Prog::default();
    let (x, bias) = (p.input(&[64, 1024], f), p.input(&[1024], f));
    let v = xs(&[64, 1024]);
    let mut b = B::default();
    let (l, w) = (b.load(x, v[0] * 1024 + v[1], f), b.load(bias, v[1], f));
    let y = b.binary(BinaryOp::Add, l, w, f);
    let out = p.pointwise(&[64, 1024], f, b.done(y));
    p.output(out);
    let k = kernel("poi_fused_add_0", KernelKind::Pointwise, vec![0], 64 * 1024, None, vec![out]);
    let (src, _) = emit_cuda_kernel(&build_kernel(&p.p, &k)).unwrap();
    assert!(src.contains("coil_load<uint16_t, 8, 8>(in_ptr1 + (8*(xvec % 128)), aligned)"), "{src}");
    // 8192 groups in 32 blocks of 256 threads: covered at once, no grid-stride loop
    assert!(src.contains("const int xvec = (int)blockIdx.x * blockDim.x + threadIdx.x;\n    {"), "{src}");
    // 2^31 elements: indices need 64 bits
    let (p, k) = pointwise_n(1 << 31, DType::BF16);
    let (src, _) = emit_cuda_kernel(&build_kernel(&p, &k)).unwrap();
    assert!(src.contains("const int64_t xvec = (int64_t)blockIdx.x"), "{src}");
    syntax_check(&format!("{}\n{src}", prelude()));
}

#[test]
fn module_is_deterministic_and_passes_the_syntax_check() {
    let kernels = all_kernels();
    let m = emit_cuda(&kernels).unwrap();
    assert_eq!(m, emit_cuda(&kernels).unwrap());
    assert_eq!(m.kernels.len(), kernels.len());
    assert!(!m.source.contains("#include"));
    syntax_check(&m.source);
    // one kernel with the prelude, as dumped
    syntax_check(&emit_cuda_kernel_source(&kernels[0], &GpuTarget::h100()).unwrap());
    // COIL_CUDA_DUMP=<dir>: the module and its launches, for running on a GPU
    if let Ok(dir) = std::env::var("COIL_CUDA_DUMP") {
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(format!("{dir}/module.cu"), &m.source).unwrap();
        let launches: String = (m.kernels.iter())
            .zip(&kernels)
            .map(|(k, t)| {
                let args: Vec<String> = t.args.iter().map(|a| format!("{}:{}", a.name, a.dtype)).collect();
                format!("{} {} {} {}\n", k.name, k.launch.grid, k.launch.block, args.join(" "))
            })
            .collect();
        std::fs::write(format!("{dir}/launches.txt"), launches).unwrap();
    }
}

#[test]
fn signed_zeros_keep_their_sign_in_cuda_c() {
    let (p, k) = signed_zeros();
    let src = emit_cuda_kernel_source(&tile(&p, &k, "signed_zeros"), &GpuTarget::h100()).unwrap();
    // both zero constants, and max / min with the tie select (FMNMX orders -0.0 below +0.0)
    assert!(src.contains(" = 0.0f;") && src.contains(" = -0.0f;"), "{src}");
    assert!(src.contains("coil_maximum_f32(") && src.contains("return a == b ? a : r;"), "{src}");
    syntax_check(&src);
}

#[test]
fn every_op_and_dtype_generates() {
    // Each unary and binary op on each dtype the C backend accepts, cast to every dtype.
    let dtypes = [
        DType::Bool,
        DType::U8,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
    ];
    let mut kernels = Vec::new();
    for (n, &d) in dtypes.iter().enumerate() {
        let mut p = Prog::default();
        let (a, b_) = (p.input(&[16], d), p.input(&[16], d));
        let v = xs(&[16])[0];
        let mut outs = Vec::new();
        // (bit ops of integers and bools only, on their own dtype)
        for op in UnaryOp::ALL.into_iter().filter(|op| !(op.integral_only() && d.is_float())) {
            let out = if op.returns_bool() {
                DType::Bool
            } else if d.is_float() || op.integral_only() {
                d
            } else {
                DType::F32
            };
            let mut b = B::default();
            let l = b.load(a, v, d);
            let c = if out == d || op.returns_bool() { l } else { b.push(ScalarOp::Cast(l), out) };
            let r = b.unary(op, c, out);
            outs.push(p.pointwise(&[16], out, b.done(r)));
        }
        let shift = |op: BinaryOp| matches!(op, BinaryOp::ShiftLeft | BinaryOp::ShiftRight);
        for op in BinaryOp::ALL
            .into_iter()
            .filter(|&op| !(op.integral_only() && (d.is_float() || d == DType::Bool && shift(op))))
        {
            let out = if op.returns_bool() {
                DType::Bool
            } else if op.float_only() && !d.is_float() {
                DType::F32
            } else {
                d
            };
            let mut b = B::default();
            let (x, y) = (b.load(a, v, d), b.load(b_, v, d));
            let r = b.binary(op, x, y, out);
            outs.push(p.pointwise(&[16], out, b.done(r)));
        }
        for &to in &dtypes {
            let mut b = B::default();
            let l = b.load(a, v, d);
            let c = b.push(ScalarOp::Cast(l), to);
            outs.push(p.pointwise(&[16], to, b.done(c)));
        }
        let nodes = (0..outs.len()).collect();
        let k = kernel(&format!("poi_ops_{n}"), KernelKind::Pointwise, nodes, 16, None, outs);
        kernels.push(build_kernel(&p.p, &k));
        // and every reduction of this dtype, persistent and looped
        for (kind, cols) in [(KernelKind::PersistentReduction, 40), (KernelKind::LoopedReduction, 2048)] {
            let mut p = Prog::default();
            let x = p.input(&[3, cols], d);
            let (xv, rv) = (xs(&[3])[0], rs(&[cols])[0]);
            let mut outs = Vec::new();
            for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min, ReduceOp::ArgMax, ReduceOp::ArgMin]
            {
                let out = match op {
                    ReduceOp::ArgMax | ReduceOp::ArgMin => DType::I64,
                    ReduceOp::Sum | ReduceOp::Prod if !d.is_float() => DType::I64,
                    _ => d,
                };
                let mut b = B::default();
                let l = b.load(x, xv * cols as i64 + rv, d);
                outs.push(p.reduction(&[3], &[cols], op, out, b.done(l)));
            }
            let nodes = (0..outs.len()).collect();
            let k = kernel(&format!("red_ops_{n}_{cols}"), kind, nodes, 3, Some(cols), outs);
            kernels.push(build_kernel(&p.p, &k));
        }
    }
    let m = emit_cuda(&kernels).unwrap();
    syntax_check(&m.source);
    if let Ok(dir) = std::env::var("COIL_CUDA_DUMP") {
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(format!("{dir}/ops.cu"), &m.source).unwrap();
    }
}

// ---------------------------------------------------------------- dynamic shapes

/// A program over an f32 input `[s0, 4]` (`s0` = input 0 dim 0, hint 8) with one kernel of each
/// shape a size symbol can take, all outputs:
/// * `poi_fused_relu_0`: `relu(2x + 1)` over `4*s0` elements (symbolic xnumel, vectorizable);
/// * `red_fused_sum_1`: column sums, 4 rows of `s0` (looped, symbolic row, strided reads);
/// * `per_fused_sum_2`: row sums, `s0` rows of 4 (persistent, symbolic xnumel);
/// * `poi_fused_sub_3`: `x[:, 0] - x[:, 3]` over `s0` elements (partial groups at run time);
/// * `red_fused_sum_4`: the sum of squares, one row of `4*s0` (looped, vectorizable row).
pub(crate) fn dynamic_program() -> (LoopProgram, Vec<FusedKernel>) {
    use coil_ir::loops::{range_var, reduction_var, LoopBuffer, LoopKind, LoopNode, SizeSymbol};
    use coil_ir::sym::Expr;
    use coil_ir::TensorMeta;
    let f = DType::F32;
    let s0 = Expr::size("s0");
    let hint = 8usize;
    let buffer = |name: &str, shape: Vec<Expr>| {
        let at_hint = |e: &Expr| e.eval(&[(s0, hint as i64)].into()).unwrap() as usize;
        let meta = TensorMeta::new(shape.iter().map(at_hint).collect::<Vec<usize>>(), f);
        LoopBuffer { name: name.into(), meta, shape }
    };
    let x = coil_ir::loops::BufferId(0);
    let mut buffers = vec![buffer("arg0", vec![s0, Expr::int(4)])];
    let mut nodes = Vec::new();
    let mut kernels = Vec::new();
    let mut add = |name: &str, kind: KernelKind, shape: Vec<Expr>, lk: LoopKind, xn: Expr, rn: Option<Expr>| {
        let out = coil_ir::loops::BufferId(buffers.len());
        buffers.push(buffer(&format!("buf{}", nodes.len() + 1), shape));
        kernels.push(FusedKernel {
            name: name.into(),
            kind,
            nodes: vec![nodes.len()],
            xnumel: xn,
            rnumel: rn,
            stores: vec![out],
        });
        nodes.push(LoopNode { output: out, origins: vec!["test"], kind: lk });
    };
    // relu(2x + 1) over [s0, 4]
    let (x0, x1) = (range_var(0, &s0), range_var(1, &Expr::int(4)));
    let mut b = B::default();
    let l = b.load(x, x0 * 4 + x1, f);
    let (two, one, zero) = (b.constant(2.0, f), b.constant(1.0, f), b.constant(0.0, f));
    let m = b.binary(BinaryOp::Mul, l, two, f);
    let a = b.binary(BinaryOp::Add, m, one, f);
    let r = b.binary(BinaryOp::Maximum, a, zero, f);
    let ranges = vec![s0, Expr::int(4)];
    let lk = LoopKind::Pointwise { ranges: ranges.clone(), body: b.done(r), scatter: None };
    add("poi_fused_relu_0", KernelKind::Pointwise, ranges, lk, s0 * 4, None);
    // column sums: out[x0] = sum over r0 < s0 of x[4*r0 + x0]
    let (x0, r0) = (range_var(0, &Expr::int(4)), reduction_var(0, &s0));
    let mut b = B::default();
    let l = b.load(x, r0 * 4 + x0, f);
    let lk = LoopKind::Reduction {
        ranges: vec![Expr::int(4)],
        reduction_ranges: vec![s0],
        op: ReduceOp::Sum,
        body: b.done(l),
    };
    add("red_fused_sum_1", KernelKind::LoopedReduction, vec![Expr::int(4)], lk, Expr::int(4), Some(s0));
    // row sums: out[x0] = sum over r0 < 4 of x[4*x0 + r0]
    let (x0, r0) = (range_var(0, &s0), reduction_var(0, &Expr::int(4)));
    let mut b = B::default();
    let l = b.load(x, x0 * 4 + r0, f);
    let lk = LoopKind::Reduction {
        ranges: vec![s0],
        reduction_ranges: vec![Expr::int(4)],
        op: ReduceOp::Sum,
        body: b.done(l),
    };
    add("per_fused_sum_2", KernelKind::PersistentReduction, vec![s0], lk, s0, Some(Expr::int(4)));
    // x[:, 0] - x[:, 3]
    let x0 = range_var(0, &s0);
    let mut b = B::default();
    let (p, q) = (b.load(x, x0 * 4, f), b.load(x, x0 * 4 + 3, f));
    let d = b.binary(BinaryOp::Sub, p, q, f);
    let lk = LoopKind::Pointwise { ranges: vec![s0], body: b.done(d), scatter: None };
    add("poi_fused_sub_3", KernelKind::Pointwise, vec![s0], lk, s0, None);
    // sum of squares of everything: one row of 4*s0
    let r0 = reduction_var(0, &(s0 * 4));
    let mut b = B::default();
    let l = b.load(x, r0, f);
    let sq = b.binary(BinaryOp::Mul, l, l, f);
    let lk = LoopKind::Reduction {
        ranges: vec![Expr::int(1)],
        reduction_ranges: vec![s0 * 4],
        op: ReduceOp::Sum,
        body: b.done(sq),
    };
    add("red_fused_sum_4", KernelKind::LoopedReduction, vec![Expr::int(1)], lk, Expr::int(1), Some(s0 * 4));
    let outputs = (1..buffers.len()).map(coil_ir::loops::BufferId).collect();
    let program = LoopProgram {
        symbols: vec![SizeSymbol { symbol: s0, input: 0, dim: 0, hint: hint as i64 }],
        data_checks: vec![],
        buffers,
        inputs: vec![x],
        outputs,
        nodes,
    };
    (program, kernels)
}

#[test]
fn symbolic_sizes_are_kernel_parameters() {
    let (p, ks) = dynamic_program();
    let tiles: Vec<TileKernel> = ks.iter().map(|k| build_kernel(&p, k)).collect();
    let s0 = coil_ir::sym::Expr::size("s0");
    for t in &tiles {
        assert_eq!(t.sizes, vec![s0], "{}", t.name);
    }
    let m = emit_cuda(&tiles).unwrap();
    syntax_check(&m.source);
    let src = |i: usize| emit_cuda_kernel(&tiles[i]).unwrap();
    // symbolic xnumel: the size is a parameter after the buffers, the grid is left to each run
    let (poi, launch) = src(0);
    assert!(poi.contains("(const float *in_ptr0, float *out_ptr0, int64_t s0, int64_t *status)"), "{poi}");
    assert!(poi.contains("const int64_t xnumel = 4*s0;"), "{poi}");
    assert_eq!(launch, Launch { grid: 0, block: 256, shared_bytes: 0, per_block: 1024, max_grid: 0, cluster: 1 });
    assert_eq!((launch.grid_for(8), launch.grid_for(1024), launch.grid_for(1025)), (1, 1, 2));
    // 4*s0 elements: groups of 4 are always full, and vector accesses stay
    assert!(poi.contains("xvec < s0;") && !poi.contains("xindex >= xnumel"), "{poi}");
    assert!(poi.contains("coil_load<float, 4, 4>(in_ptr0 + (4*xvec), aligned)"), "{poi}");
    assert!(poi.contains("coil_store<float, 4, 4>(out_ptr0 + (4*xvec), st"), "{poi}");
    snapshot("cuda_dynamic_pointwise", poi);
    // a row of symbolic length: a looped reduction over `s0` positions, element by element
    let (red, launch) = src(1);
    assert_eq!((launch.grid, launch.per_block), (4, 1));
    assert!(red.contains("for (int64_t rchunk = rlane; rchunk < s0; rchunk += 1024) {"), "{red}");
    // symbolic rows of a constant length
    let (per, launch) = src(2);
    assert_eq!((launch.grid, launch.block, launch.per_block), (0, 256, 8));
    assert!(per.contains("const int64_t xnumel = s0;") && per.contains("xindex < xnumel"), "{per}");
    // s0 elements in groups of 4: whether a group is full is decided at run time
    let (sub, _) = src(3);
    assert!(sub.contains("xvec < (s0 + 3) / 4;") && sub.contains("if (xvec < s0 / 4) {"), "{sub}");
    assert!(sub.contains("if (xindex >= xnumel) break;"), "{sub}");
    // a row of 4*s0: groups of 4 divide it, so vector loads
    let (sum, _) = src(4);
    assert!(
        sum.contains("rchunk < s0;") && sum.contains("coil_load<float, 4, 4>(in_ptr0 + (4*rchunk), aligned)"),
        "{sum}"
    );
    // static kernels keep their signature
    let (p, k) = pointwise_n(64, DType::F32);
    let (stat, _) = emit_cuda_kernel(&build_kernel(&p, &k)).unwrap();
    assert!(stat.contains("float *out_ptr1, int64_t *status)") && !stat.contains("int64_t s0"), "{stat}");
}

#[test]
fn size_names_the_kernel_uses_are_refused() {
    let (p, ks) = dynamic_program();
    let mut t = build_kernel(&p, &ks[0]);
    assert!(emit_cuda_kernel(&t).is_ok());
    t.sizes = vec![coil_ir::sym::Expr::size("xvec")];
    let e = emit_cuda_kernel(&t).unwrap_err();
    assert!(e.message.contains("xvec"), "{}", e.message);
}

#[test]
fn online_softmax_one_pass_and_pairwise_block_combine() {
    // softmax: the max and the sum in one pass over the row, the stores in a second
    let (p, k) = softmax(3, 2000, KernelKind::LoopedReduction, "red_fused_softmax_0");
    let (src, _) = emit_cuda_kernel(&build_kernel(&p, &k)).unwrap();
    assert_eq!(src.matches("coil_load<").count(), 2, "{src}");
    assert!(src.contains("__shared__ coil_ms<float> smem1[9];"), "{src}");
    assert!(src.contains("float ox1[4];") && src.contains("ox1[i] = tmp0;"), "{src}");
    assert!(src.contains("coil_online_group<float, 4>(acc1, acc2, ox1);"), "{src}");
    assert!(src.contains("coil_reduce_costly<8>(coil_ms<float>{acc1, acc2}, coil_online(), smem1);"), "{src}");
    assert!(src.contains("const float tmp2 = coil_online_sum(red1);") && !src.contains("coil_max_f32()"), "{src}");
    // logsumexp: one pass; the sum relative to where(isinf(max), 0, max)
    let (p, k) = online(4, Some(50304), DType::F32, Online::LogSumExp, false);
    let (src, launch) = emit_cuda_kernel(&build_kernel(&p, &k)).unwrap();
    assert_eq!((launch.block, src.matches("coil_load<").count()), (1024, 1), "{src}");
    assert!(src.contains("coil_reduce_costly<32>(coil_ms<float>{acc1, acc2}, coil_online(), smem1);"), "{src}");
    assert!(src.contains("const float tmp2 = coil_online_sum_finite(red1);"), "{src}");
    // f64 pairs; a column plan combines through shared memory
    let (p, k) = online(64, Some(2000), DType::F64, Online::Stats, true);
    let t = build_kernel(&p, &k);
    assert!(launch::plan(&t, &GpuTarget::h100()).col);
    let (src, _) = emit_cuda_kernel(&t).unwrap();
    assert!(src.contains("coil_online_group<double, 1>(acc1, acc2, ox1);"), "{src}");
    assert!(
        src.contains("coil_reduce_col_costly<") && src.contains("(coil_ms<double>{acc1, acc2}, coil_online(), smem1)"),
        "{src}"
    );
    // bf16 in, f32 pairs, a symbolic row
    let (p, k) = online(8, None, DType::BF16, Online::Softmax, false);
    let (src, _) = emit_cuda_kernel(&build_kernel(&p, &k)).unwrap();
    assert!(src.contains("coil_online_group<float, 1>(acc2, acc3, ox2);") && src.contains("rchunk < s0;"), "{src}");
    let module = emit_cuda(&all_kernels()).unwrap();
    syntax_check(&module.source);
}

/// A layer's key and value caches written at one position: two windows of the same offset,
/// size and bound, the second needing no check of its own (what each backend writes of it:
/// `tests/filetests/windows_checked_once.coil`); the CUDA C compiles.
#[test]
fn windows_of_one_offset_are_checked_once() {
    let k = TileKernel::parse(
        "\
@kernel(kind=pointwise)
def poi_fused_scatter_0(in_ptr0: *i64 (buffer 1), in_ptr1: *f32 (buffer 2), out_ptr0: *f32 (buffer 3), out_ptr1: *f32 (buffer 4)):
    xnumel = 64
    XBLOCK: constexpr = 1024
    xindex = program_id(0) * XBLOCK + arange(XBLOCK)[:, None]
    xmask = xindex < xnumel
    tmp0: i64[XBLOCK, 1] = load(in_ptr0 + (0))
    window(out_ptr0, offset=tmp0, stride=16, size=4, bound=32)
    window(out_ptr1, offset=tmp0, stride=16, size=4, bound=32)
    tmp1: f32[XBLOCK, 1] = load(in_ptr1 + (xindex))
    store(out_ptr0 + (xindex), tmp1, xmask)
    store(out_ptr1 + (xindex), tmp1, xmask)
",
    )
    .unwrap();
    assert!(k.window_needs_check(1) && !k.window_needs_check(2));
    syntax_check(&emit_cuda_kernel_source(&k, &GpuTarget::h100()).unwrap());
}
