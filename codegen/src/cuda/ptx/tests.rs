//! The generated PTX: snapshots of the classic kernels (read them beside the CUDA C ones),
//! which shapes have a PTX form, and an assembly check with `ptxas` where one is installed
//! (`COIL_PTXAS`, or `ptxas` on the `PATH`; the GPU tests run the kernels).

use super::*;
use crate::cuda::tests::{all_kernels, col_argmax, col_mean, col_sum, col_var, layer_norm};
use crate::testutil::softmax;
use crate::tile::build_kernel;
use coil_ir::kernel::KernelKind;
use coil_ir::DType;

fn snapshot(name: &str, text: String) {
    insta::with_settings!({ snapshot_path => "../../snapshots", prepend_module_to_snapshot => false }, {
        insta::assert_snapshot!(name, text);
    });
}

fn ptx(k: &TileKernel) -> String {
    emit_ptx(k, &GpuTarget::h100(), &Tuning::default()).unwrap_or_else(|why| panic!("{}: no PTX: {why}", k.name)).source
}

/// A cache write checks its window once (one error record, by the launch's first thread; every
/// thread returns before it stores), moves the cache's pointer and stores each group of 4 f32
/// as one unguarded vector; in a Llama layer's bf16 write, 8 values as one 16-byte store.
#[test]
fn scatter_store_checks_its_window_once_and_stores_vectors() {
    let (p, k) = crate::tile::tests::cache_write();
    let src = ptx(&build_kernel(&p, &k));
    assert_eq!(src.matches("atom.global.cas.b64").count(), 1, "{src}");
    assert_eq!(src.lines().filter(|l| l.trim_start().starts_with("@%p") && l.contains(" ret;")).count(), 1, "{src}");
    let stores: Vec<&str> = src.lines().filter(|l| l.contains("st.global.") && !l.contains("b64 [%rd")).collect();
    assert!(stores.iter().all(|l| !l.trim_start().starts_with('@')), "{stores:?}");
    assert_eq!(stores.iter().filter(|l| l.contains("st.global.v4.f32")).count(), 1, "{src}");
    snapshot("ptx_cache_write", src);
    let (p, k) = crate::tile::tests::cache_write_of("bf16", 8, 256, 16, 64);
    let src = ptx(&build_kernel(&p, &k));
    assert_eq!(src.matches("st.global.v4.b32").count(), 1, "{src}");
    assert_eq!(src.matches("st.global.").count(), 3, "the vector and the error's two words\n{src}");
}

#[test]
fn pointwise_bf16_loads_words_and_rounds_pairs() {
    let (p, k) = crate::tile::tests::pointwise_chain(DType::BF16);
    let src = ptx(&build_kernel(&p, &k));
    // 8 bf16 per thread: one 16-byte load, one 16-byte store of 4 rounded pairs
    assert_eq!(src.matches("ld.global.v4.b32").count(), 1, "{src}");
    assert_eq!(src.matches("cvt.rn.bf16x2.f32").count(), 4, "{src}");
    assert_eq!(src.matches("st.global.v4.b32").count(), 1, "{src}");
    snapshot("ptx_pointwise_bf16", src);
}

#[test]
fn layer_norm_chunks_share_their_addresses() {
    let (p, k) = layer_norm(37, 1536, KernelKind::PersistentReduction);
    let src = ptx(&build_kernel(&p, &k));
    // two chunks of 4 f32 per thread: x is loaded once (the later passes read registers), the
    // second chunk at an immediate offset from the first (192 threads * 4 * 4 bytes)
    assert_eq!(src.matches("ld.global.v4.f32").count(), 2 + 2 * 2, "{src}");
    assert!(src.contains("+3072]"), "{src}");
    // 6 warps per row: the shared-memory stage between two barriers, twice
    assert_eq!(src.matches("bar.sync 0").count(), 4, "{src}");
    // the weights and biases, read after the mean and the variance, are loaded with the row
    assert!(src.rfind("ld.global.v4.f32") < src.find("bar.sync 0"), "{src}");
    // both chunks' loads come before the first chunk's arithmetic
    assert!(src.match_indices("ld.global.v4.f32").nth(5).map(|(i, _)| i) < src.find("add.f32"), "{src}");
    snapshot("ptx_layer_norm", src);
}

#[test]
fn memory_bound_rows_assemble_at_level_1() {
    let plan = |k: &TileKernel| crate::cuda::launch::plan_with(k, &Tuning::default(), &GpuTarget::h100());
    // rows over many blocks, every chunk full: level 1
    let (p, k) = layer_norm(4096, 1536, KernelKind::PersistentReduction);
    let norm = build_kernel(&p, &k);
    assert_eq!(assembler_level(&norm, &plan(&norm)), 1);
    // the same rows in one block (latency-bound): the highest level
    let one_block = Plan { launch: crate::cuda::Launch { grid: 1, ..plan(&norm).launch }, ..plan(&norm) };
    assert_eq!(assembler_level(&norm, &one_block), 4);
    // a chunk some threads skip (1000 = 192 * 5 + 40), a looped reduction, a column plan: the
    // highest level
    let (p, k) = layer_norm(4096, 1000, KernelKind::PersistentReduction);
    let (q, l) = softmax(4096, 2048, KernelKind::LoopedReduction, "red_fused_softmax_0");
    let (r, m) = col_sum(4096, 8192, KernelKind::PersistentReduction);
    for k in [build_kernel(&p, &k), build_kernel(&q, &l), build_kernel(&r, &m)] {
        assert_eq!(assembler_level(&k, &plan(&k)), 4, "{}", k.name);
    }
}

#[test]
fn looped_softmax_folds_groups_online() {
    let (p, k) = softmax(3, 2000, KernelKind::LoopedReduction, "red_fused_softmax_0");
    let t = build_kernel(&p, &k);
    let src = ptx(&t);
    // the online pass and the epilogue: four groups per loop step, then one
    assert!(src.contains("max.NaN.f32") && src.contains("ex2.approx.ftz.f32"), "{src}");
    assert_eq!(src.matches("bra.uni").count(), 4, "{src}");
    // 256 threads: no occupancy directive (only 1024-thread looped kernels get one)
    assert!(!src.contains(".minnctapersm"), "{src}");
    assert_eq!(src, ptx(&t), "deterministic");
    // the division by the row's sum: one reciprocal (no `rcp.rn` and its slow-path call) before
    // the epilogue's loop, then multiplies
    assert_eq!(src.matches("rcp.approx.f32").count(), 1, "{src}");
    assert!(!src.contains("div.full.f32") && !src.contains("rcp.rn"), "{src}");
    assert!(src.find("rcp.approx.f32") < src.rfind("bra.uni"), "{src}");
    snapshot("ptx_softmax_looped", src);
}

#[test]
fn wide_column_mean_takes_vectors_of_outputs() {
    // 8192 outputs, 4 per thread: one 16-byte load per reduced position, eight positions per
    // loop step; the accumulators staged in 4 planes, each output folded by one thread
    let (p, k) = col_mean(300, 8192);
    let src = ptx(&build_kernel(&p, &k));
    assert_eq!(src.matches("ld.global.v4.f32").count(), 8 + 1, "{src}");
    assert!(src.contains(".shared .align 8 .b8 col_mean_0_smem5[16384];") || src.contains("[16384];"), "{src}");
    assert_eq!(src.matches("st.shared.f32").count(), 4, "{src}");
    // 63 partials after the first, per output
    assert_eq!(src.matches("ld.shared.f32").count(), 64, "{src}");
    // the mean's division by the literal 300 is a multiply by its reciprocal, folded here
    assert!(!src.contains("rcp.") && !src.contains("div."), "{src}");
    snapshot("ptx_col_mean_vectors", src);
}

#[test]
fn looped_column_sum_strides_down_its_rows() {
    // 3000 rows: looped; 32 outputs per block, one per lane, 32 threads along the rows, four
    // rows per loop step then one; the partials staged in one plane, folded by lane 0's row
    let (p, k) = col_sum(3000, 256, KernelKind::LoopedReduction);
    let t = build_kernel(&p, &k);
    let src = ptx(&t);
    assert_eq!(src.matches("ld.global.f32").count(), 4 + 1, "{src}");
    assert_eq!(src.matches("st.shared.f32").count(), 1, "{src}");
    assert_eq!(src.matches("ld.shared.f32").count(), 32, "{src}");
    assert_eq!(src.matches("st.global.f32").count(), 1, "{src}");
    assert_eq!(emit_ptx(&t, &GpuTarget::h100(), &Tuning::default()).unwrap().kernels[0].launch.grid, 8);
    assert!(assemble(&[("col_sum_looped".into(), src)]) || std::env::var("COIL_PTXAS").is_err());
}

#[test]
fn column_variance_folds_each_pass_in_every_thread() {
    // 300 rows over 32 threads along them: 10 chunks held in registers between the mean's pass
    // and the deviations'; each pass's 32 partials per output folded by every thread (32
    // shared loads each), the variance stored by the threads of lane 0
    let (p, k) = col_var(300, 256, KernelKind::PersistentReduction);
    let t = build_kernel(&p, &k);
    let src = ptx(&t);
    assert_eq!(src.matches("ld.global.f32").count(), 10, "{src}");
    assert_eq!(src.matches("st.shared.f32").count(), 2, "{src}");
    assert_eq!(src.matches("ld.shared.f32").count(), 2 * 32, "{src}");
    assert_eq!(src.matches("bar.sync 0").count(), 4, "{src}");
    assert_eq!(src.matches("st.global.f32").count(), 1, "{src}");
    assert!(assemble(&[("col_var".into(), src)]) || std::env::var("COIL_PTXAS").is_err());
    // 3000 rows: two looped passes (four rows per step, then one), the same folds
    let (p, k) = col_var(3000, 256, KernelKind::LoopedReduction);
    let src = ptx(&build_kernel(&p, &k));
    assert_eq!(src.matches("bra.uni").count(), 2 * 2, "{src}");
    assert_eq!(src.matches("ld.global.f32").count(), 2 * (4 + 1), "{src}");
    assert_eq!(src.matches("ld.shared.f32").count(), 2 * 32, "{src}");
    assert!(assemble(&[("col_var_looped".into(), src)]) || std::env::var("COIL_PTXAS").is_err());
}

#[test]
fn column_argmax_folds_value_index_pairs() {
    // 300 rows over 32 threads along them: each thread's best (value, index) over its rows,
    // then both staged and every thread picking its output's best of 32 in order
    let (p, k) = col_argmax(300, 256);
    let src = ptx(&build_kernel(&p, &k));
    assert_eq!(src.matches("ld.global.f32").count(), 10, "{src}");
    assert_eq!(src.matches("st.shared.b64").count(), 1, "{src}");
    assert_eq!(src.matches("ld.shared.f32").count(), 32, "{src}");
    assert_eq!(src.matches("ld.shared.b64").count(), 32, "{src}");
    assert_eq!(src.matches("st.global.s64").count(), 1, "{src}");
    assert!(assemble(&[("col_argmax".into(), src)]) || std::env::var("COIL_PTXAS").is_err());
}

#[test]
fn shapes_without_a_ptx_form_say_why() {
    let kernels = all_kernels();
    let mut covered = 0;
    for k in &kernels {
        match emit_ptx(k, &GpuTarget::h100(), &Tuning::default()) {
            Ok(m) => {
                covered += 1;
                assert!(matches!(m.language, Language::Ptx { .. }));
                assert_eq!(
                    m.kernels[0].launch,
                    crate::cuda::launch::plan_with(k, &Tuning::default(), &GpuTarget::h100()).launch
                );
            }
            Err(why) => {
                let known = ["cluster", "column plan", "f64", "arg reduction", "random", "values per thread"];
                assert!(known.iter().any(|w| why.contains(w)), "{}: unexpected reason {why:?}", k.name);
            }
        }
    }
    // everything but f64 rows and column plans of several passes
    assert!(covered * 10 >= kernels.len() * 7, "{covered} of {}", kernels.len());
    // no target for GPUs before sm_80 (max.NaN) or unknown ones
    assert!(emit_ptx(&kernels[0], &GpuTarget { compute_capability: (7, 5), ..GpuTarget::h100() }, &Tuning::default())
        .unwrap_err()
        .contains("sm_75"));
}

/// `ptxas -arch=sm_90` on each module (name, PTX), where it is installed (`COIL_PTXAS`, or
/// `ptxas` on the `PATH`); `false` when it is not.
fn assemble(modules: &[(String, String)]) -> bool {
    let ptxas = std::env::var("COIL_PTXAS").unwrap_or_else(|_| "ptxas".into());
    if std::process::Command::new(&ptxas).arg("--version").output().is_err() {
        coil_ir::testing::skip(format!("no ptxas ({ptxas}); set COIL_PTXAS to check the PTX assembles"));
        return false;
    }
    let dir = std::env::temp_dir().join(format!("coil_ptx_{}_{}", std::process::id(), modules[0].0));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, source) in modules {
        let path = dir.join(format!("{name}.ptx"));
        std::fs::write(&path, source).unwrap();
        let out = std::process::Command::new(&ptxas)
            .args(["-arch=sm_90", "-o"])
            .arg(dir.join(format!("{name}.cubin")))
            .arg(&path)
            .output()
            .unwrap();
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let _ = std::fs::remove_dir_all(&dir);
    true
}

/// Every PTX module of [`all_kernels`] through `ptxas`, where it is installed.
#[test]
fn every_module_assembles_where_ptxas_is_installed() {
    let modules: Vec<(String, String)> = (all_kernels().iter())
        .filter_map(|k| emit_ptx(k, &GpuTarget::h100(), &Tuning::default()).ok().map(|m| (k.name.clone(), m.source)))
        .collect();
    assemble(&modules);
}

#[test]
fn cluster_rows_meet_in_distributed_shared_memory() {
    // 12289 f32 per row: more than a block holds, split over a cluster of blocks
    let (p, k) = softmax(3, 12289, KernelKind::PersistentReduction, "per_fused_softmax_0");
    let t = build_kernel(&p, &k);
    let plan = crate::cuda::launch::plan_with(&t, &Tuning::default(), &GpuTarget::h100());
    assert!(plan.cluster > 1, "{plan:?}");
    let src = ptx(&t);
    assert!(src.contains(&format!(".reqnctapercluster {}, 1, 1", plan.cluster)), "{src}");
    // two reductions, each folding the blocks' results in block order, then the row's end
    assert_eq!(src.matches("mapa.shared::cluster.u32").count(), 2 * plan.cluster, "{src}");
    assert_eq!(src.matches("barrier.cluster.wait.acquire.aligned").count(), 3, "{src}");
}

#[test]
fn division_by_a_constant_is_exact_for_every_index() {
    use super::kernel::division_magic;
    for bits in [31u32, 63] {
        let top = (1u128 << bits) - 1;
        for d in (2u64..3000).chain([4095, 4097, 8191, 50304, 1 << 20, 1_000_003, (1 << 31) - 1]) {
            let (m, s) = division_magic(d, bits);
            let q = |x: u128| ((x * u128::from(m)) >> (bits + 1)) >> s;
            let samples = [0, 1, u128::from(d) - 1, u128::from(d), 3 * u128::from(d) - 1, top - 1, top, top / 3];
            for x in samples.into_iter().filter(|&x| x <= top) {
                assert_eq!(q(x), x / u128::from(d), "x {x} / d {d} ({bits} bits)");
            }
        }
    }
    // the emitted code: a power of two is a mask, another constant a multiply-high
    let (p, k) = crate::tile::tests::pointwise_chain(DType::BF16);
    let src = ptx(&build_kernel(&p, &k));
    assert!(!src.contains("div.") && !src.contains("rem."), "{src}");
}

#[test]
fn symbolic_rows_of_a_block_each_take_a_guard_not_a_loop() {
    let (p, k) = layer_norm(37, 1536, KernelKind::PersistentReduction);
    let mut t = build_kernel(&p, &k);
    let s0 = coil_ir::sym::Expr::size("s0");
    (t.xnumel, t.sizes) = (s0, vec![s0]);
    assert!(crate::cuda::launch::plan(&t, &GpuTarget::h100()).grid_covers_rows(&t));
    let src = ptx(&t);
    // a block per row, the grid sized at each run: `xindex < s0`, and no branch back
    assert!(src.contains("setp.ge.s64"), "{src}");
    assert!(!src.contains("bra.uni"), "{src}");
}

#[test]
fn arg_reductions_carry_value_index_pairs() {
    // a warp per row: the pair through a shuffle tree (the index in two 32-bit halves)
    let (p, k) = crate::tile::tests::argmax(4, 5);
    let src = ptx(&build_kernel(&p, &k));
    assert!(src.contains("setp.nan.f32") && src.contains("selp.b64"), "{src}");
    assert!(!src.contains("bar.sync"), "{src}");
    // rows of several warps: a shared-memory stage of values and indices between two barriers
    let (p, k) = crate::tile::tests::argmax(4, 3000);
    let t = build_kernel(&p, &k);
    let src = ptx(&t);
    assert!(src.contains("_i[") && src.contains("st.shared.b64"), "{src}");
    assert_eq!(src.matches("bar.sync 0").count(), 2, "{src}");
    // an empty row's index is 0, not the identity's
    assert!(src.contains("9223372036854775807"), "{src}");
    snapshot("ptx_argmax_block", src);
}

#[test]
fn random_numbers_are_philox_rounds_and_f64_box_muller() {
    use crate::testutil::{kernel, xs, Prog, B};
    use coil_ir::loops::ScalarOp;
    let mut p = Prog::default();
    let v = xs(&[64])[0];
    let mut outs = Vec::new();
    for (dist, d) in [(coil_ir::RandDist::Uniform, DType::F32), (coil_ir::RandDist::Normal, DType::BF16)] {
        let mut b = B::default();
        let r = b.push(ScalarOp::Rand { dist, stream: 1, counter: v + 5 }, d);
        outs.push(p.pointwise(&[64], d, b.done(r)));
    }
    let k = kernel("poi_fused_rand_0", KernelKind::Pointwise, vec![0, 1], 64, None, outs);
    let tile = build_kernel(&p.p, &k);
    assert_eq!(tile.random, vec![1]);
    let src = ptx(&tile);
    // the stream's key and first counter are the parameters after the buffers; the rounds'
    // keys are computed once, at the entry, from the key's two words
    let params: Vec<&str> = src.lines().filter(|l| l.trim_start().starts_with(".param")).collect();
    assert_eq!(params.len(), 5, "{src}");
    assert!(src.contains("[poi_fused_rand_0_param_2]") && src.contains("[poi_fused_rand_0_param_3]"), "{src}");
    assert_eq!(src.matches("0x9E3779B9").count(), 9, "{src}");
    assert_eq!(src.matches("0xBB67AE85").count(), 9, "{src}");
    // ten rounds of two products and four xors per value, none with an immediate key; the
    // counter offset by the stream's first; then f64 log and cos
    let products = src.matches("mul.hi.u32").count();
    assert_eq!(products % 20, 0, "{src}");
    assert_eq!(src.matches("xor.b32").count(), 2 * products, "{src}");
    assert!(!src.lines().any(|l| l.contains("xor.b32") && l.contains("0x")), "{src}");
    let first = src.lines().find(|l| l.contains("[poi_fused_rand_0_param_3]")).expect("loaded");
    let first = first.trim().trim_start_matches("ld.param.u64 ").split(',').next().expect("a register");
    assert!(src.lines().any(|l| l.contains("add.u64") && l.contains(&format!(", {first}, "))), "{src}");
    assert!(src.contains("0xD2511F53") && src.contains("0xCD9E8D57"), "{src}");
    assert!(src.contains("div.rn.f64") && src.contains("sqrt.rn.f64") && src.contains(".reg .f64"), "{src}");
    assemble(&[("poi_fused_rand_0".into(), src)]);
    // an f64 output has no PTX form (f64 values go to NVRTC)
    let mut p = Prog::default();
    let mut b = B::default();
    let r = b.push(ScalarOp::Rand { dist: coil_ir::RandDist::Uniform, stream: 0, counter: v }, DType::F64);
    let out = p.pointwise(&[64], DType::F64, b.done(r));
    let k = kernel("poi_fused_rand_1", KernelKind::Pointwise, vec![0], 64, None, vec![out]);
    assert!(emit_ptx(&build_kernel(&p.p, &k), &GpuTarget::h100(), &Tuning::default()).is_err());
}

#[test]
fn a_bare_tanh_is_a_polynomial_or_an_exponential() {
    use crate::testutil::{kernel, xs, Prog, B};
    let mut p = Prog::default();
    let x = p.input(&[64], DType::F32);
    let v = xs(&[64])[0];
    let mut b = B::default();
    let l = b.load(x, v, DType::F32);
    let t = b.unary(coil_ir::UnaryOp::Tanh, l, DType::F32);
    let out = p.pointwise(&[64], DType::F32, b.done(t));
    let k = kernel("poi_fused_tanh_0", KernelKind::Pointwise, vec![0], 64, None, vec![out]);
    let src = ptx(&build_kernel(&p.p, &k));
    // per element (4 per thread): both forms, then a select rather than a branch
    assert_eq!(src.matches("copysign.f32").count(), 4, "{src}");
    assert_eq!(src.matches("ex2.approx.ftz.f32").count(), 4, "{src}");
    assert_eq!(src.matches("selp.f32").count(), 4, "{src}");
    assemble(&[("poi_fused_tanh_0".into(), src)]);
}

/// The PTX of `op(a, b)` over 64 elements: `a` of `da`, `b` of `db`, the result of `out`.
fn binary_ptx(op: coil_ir::BinaryOp, da: DType, db: DType, out: DType) -> String {
    use crate::testutil::{kernel, xs, Prog, B};
    let mut p = Prog::default();
    let (a, b) = (p.input(&[64], da), p.input(&[64], db));
    let v = xs(&[64])[0];
    let mut body = B::default();
    let (la, lb) = (body.load(a, v, da), body.load(b, v, db));
    let q = body.binary(op, la, lb, out);
    let o = p.pointwise(&[64], out, body.done(q));
    let k = kernel("poi_fused_binary_0", KernelKind::Pointwise, vec![0], 64, None, vec![o]);
    ptx(&build_kernel(&p.p, &k))
}

#[test]
fn integer_division_guards_zero_and_minus_one() {
    for op in [coil_ir::BinaryOp::FloorDiv, coil_ir::BinaryOp::TruncDiv, coil_ir::BinaryOp::Remainder] {
        let src = binary_ptx(op, DType::I64, DType::I32, DType::I64);
        // the hardware division never sees 0 or -1; a zero divisor records error 3
        assert!(src.contains("div.s64") && src.contains("selp.b64"), "{op:?}: {src}");
        assert!(src.contains("atom.global.cas.b64") && src.contains(", 0, 3;"), "{op:?}: {src}");
        assemble(&[(format!("poi_fused_div_{op:?}"), src)]);
    }
}

#[test]
fn integer_pow_squares_and_multiplies() {
    let src = binary_ptx(coil_ir::BinaryOp::Pow, DType::I64, DType::I32, DType::I64);
    // a loop over the exponent's bits; a negative exponent records error 2
    assert!(src.contains("shr.u64") && src.contains("mul.lo.s64") && src.contains("bra.uni"), "{src}");
    assert!(src.contains("atom.global.cas.b64") && src.contains(", 0, 2;"), "{src}");
    assemble(&[("poi_fused_pow".into(), src)]);
}

#[test]
fn float_floor_division_reduces_an_exact_fmod_in_f64() {
    for op in [coil_ir::BinaryOp::FloorDiv, coil_ir::BinaryOp::Remainder, coil_ir::BinaryOp::TruncDiv] {
        let src = binary_ptx(op, DType::F32, DType::F32, DType::F32);
        let fmod = src.contains("cvt.rzi.f64.f64") && src.contains("fma.rn.f64") && src.contains("bra.uni");
        assert_eq!(fmod, op != coil_ir::BinaryOp::TruncDiv, "{op:?}: {src}");
        assemble(&[(format!("poi_fused_fdiv_{op:?}"), src)]);
    }
}

#[test]
fn bool_arithmetic_is_logic() {
    // true + true is true (the C backend's `!= 0` of the integer sum), true - true is false
    for (op, want) in [(coil_ir::BinaryOp::Add, "or.pred"), (coil_ir::BinaryOp::Sub, "xor.pred")] {
        let src = binary_ptx(op, DType::Bool, DType::Bool, DType::Bool);
        assert!(src.contains(want), "{op:?}: {src}");
        assemble(&[(format!("poi_fused_bool_{op:?}"), src)]);
    }
}

#[test]
fn signed_zeros_keep_their_sign() {
    let (p, k) = crate::testutil::signed_zeros();
    let src = ptx(&build_kernel(&p, &k));
    // both zero constants, as bit patterns
    assert!(src.contains("0f80000000") && src.contains("0f00000000"), "{src}");
    // max.NaN / min.NaN order -0.0 below +0.0: a tie selects the first operand instead (four
    // elements per thread)
    assert_eq!(src.matches("max.NaN.f32").count(), 4, "{src}");
    assert_eq!(src.matches("min.NaN.f32").count(), 4, "{src}");
    assert_eq!(src.matches("setp.eq.f32").count(), 8, "{src}");
    assemble(&[("poi_fused_signed_zeros_0".into(), src)]);
}

#[test]
fn i16_results_are_stored_two_to_a_word() {
    let src = binary_ptx(coil_ir::BinaryOp::Add, DType::I32, DType::I32, DType::I16);
    assert!(src.contains("shl.b32") && src.contains("st.global.v4.b32"), "{src}");
    assemble(&[("poi_fused_i16".into(), src)]);
}

#[test]
fn narrow_column_sums_take_one_output_per_thread() {
    // 256 outputs (under the 8192 that get vectors): one plane, one folding thread per output
    let (p, k) = crate::cuda::tests::col_sum(300, 256, KernelKind::PersistentReduction);
    let t = build_kernel(&p, &k);
    let plan = crate::cuda::launch::plan_with(&t, &Tuning::default(), &GpuTarget::h100());
    assert!(plan.col && plan.col_vec == 1, "{plan:?}");
    let src = ptx(&t);
    assert_eq!(src.matches("st.shared.f32").count(), 1, "{src}");
    assert_eq!(src.matches("ld.shared.f32").count(), plan.lanes, "{src}");
    assemble(&[("col_sum_300x256".into(), src)]);
}

#[test]
fn log1p_expm1_and_sign_have_ptx_forms() {
    use crate::testutil::{kernel, xs, Prog, B};
    use coil_ir::UnaryOp::{Expm1, Log1p, Sign};
    for (op, d) in [(Log1p, DType::F32), (Expm1, DType::BF16), (Sign, DType::F32), (Sign, DType::I64)] {
        let mut p = Prog::default();
        let x = p.input(&[64], d);
        let v = xs(&[64])[0];
        let mut b = B::default();
        let l = b.load(x, v, d);
        let y = b.unary(op, l, d);
        let out = p.pointwise(&[64], d, b.done(y));
        let k = kernel("poi_fused_unary_0", KernelKind::Pointwise, vec![0], 64, None, vec![out]);
        let src = ptx(&build_kernel(&p.p, &k));
        assemble(&[(format!("poi_fused_{}_{d}", op.name()), src)]);
    }
}

#[test]
fn sin_cos_and_tan_reduce_in_f64_through_a_table() {
    use crate::testutil::{kernel, xs, Prog, B};
    use coil_ir::UnaryOp::{Cos, Sin, Tan};
    for op in [Sin, Cos, Tan] {
        let mut p = Prog::default();
        let x = p.input(&[64], DType::F32);
        let v = xs(&[64])[0];
        let mut b = B::default();
        let l = b.load(x, v, DType::F32);
        let y = b.unary(op, l, DType::F32);
        let out = p.pointwise(&[64], DType::F32, b.done(y));
        let k = kernel("poi_fused_trig_0", KernelKind::Pointwise, vec![0], 64, None, vec![out]);
        let src = ptx(&build_kernel(&p.p, &k));
        // the tables once per module, read per element
        assert_eq!(src.matches(".const .align 8 .b64 coil_pow2_mod_2pi_hi[104]").count(), 1, "{src}");
        assert_eq!(src.matches("ld.const.f64").count(), 2 * 4, "{src}");
        assemble(&[(format!("poi_fused_{}", op.name()), src)]);
    }
}

#[test]
fn pow_of_floats_goes_through_f64() {
    use crate::testutil::{kernel, xs, Prog, B};
    let mut p = Prog::default();
    let (x, y) = (p.input(&[64], DType::F32), p.input(&[64], DType::BF16));
    let v = xs(&[64])[0];
    let mut b = B::default();
    let (lx, ly) = (b.load(x, v, DType::F32), b.load(y, v, DType::BF16));
    let r = b.binary(coil_ir::BinaryOp::Pow, lx, ly, DType::F32);
    let out = p.pointwise(&[64], DType::F32, b.done(r));
    let k = kernel("poi_fused_pow_0", KernelKind::Pointwise, vec![0], 64, None, vec![out]);
    let src = ptx(&build_kernel(&p.p, &k));
    assert!(src.contains("div.rn.f64") && src.contains("cvt.rni.f64.f64"), "{src}");
    assemble(&[("poi_fused_pow_0".into(), src)]);
}

/// The PTX of `op(a)` over 64 elements of `d` (the result: `out`).
fn unary_ptx(op: coil_ir::UnaryOp, d: DType, out: DType) -> String {
    use crate::testutil::{kernel, xs, Prog, B};
    let mut p = Prog::default();
    let x = p.input(&[64], d);
    let v = xs(&[64])[0];
    let mut b = B::default();
    let l = b.load(x, v, d);
    let y = b.unary(op, l, out);
    let o = p.pointwise(&[64], out, b.done(y));
    let k = kernel("poi_fused_unary_0", KernelKind::Pointwise, vec![0], 64, None, vec![o]);
    ptx(&build_kernel(&p.p, &k))
}

#[test]
fn inverse_trig_and_erfinv_compute_in_f64() {
    use coil_ir::UnaryOp::{Acos, Asin, Atan, Erfinv};
    for (op, d) in
        [(Atan, DType::F32), (Asin, DType::F32), (Acos, DType::BF16), (Erfinv, DType::F32), (Erfinv, DType::F16)]
    {
        let src = unary_ptx(op, d, d);
        // one rounding from f64 per element (4 f32 per thread, 8 of 16 bits), no NVRTC fallback
        let per_thread = if d == DType::F32 { 4 } else { 8 };
        assert_eq!(src.matches("cvt.rn.f32.f64").count(), per_thread, "{op:?}: {src}");
        let f64_core = if op == Erfinv { "sqrt.rn.f64" } else { "div.rn.f64" };
        assert!(src.contains(f64_core) && src.contains("fma.rn.f64"), "{op:?}: {src}");
        assemble(&[(format!("poi_fused_{}_{d}", op.name()), src)]);
    }
    let src = binary_ptx(coil_ir::BinaryOp::Atan2, DType::F32, DType::F32, DType::F32);
    assert!(src.contains("copysign.f64") && src.contains("setp.nan.f32"), "{src}");
    assemble(&[("poi_fused_atan2".into(), src)]);
    // integers divide as floats (the operands converted first)
    let src = binary_ptx(coil_ir::BinaryOp::Atan2, DType::I32, DType::I32, DType::F32);
    assert!(src.contains("cvt.rn.f32.s64") && src.contains("copysign.f64"), "{src}");
}

#[test]
fn bit_ops_are_logic_instructions_and_guarded_shifts() {
    use coil_ir::BinaryOp::{BitwiseAnd, BitwiseOr, BitwiseXor, ShiftLeft, ShiftRight};
    for (op, d, want) in [
        (BitwiseAnd, DType::I32, "and.b64"),
        (BitwiseOr, DType::I64, "or.b64"),
        (BitwiseXor, DType::U8, "xor.b64"),
        (BitwiseAnd, DType::Bool, "and.pred"),
        (BitwiseXor, DType::Bool, "xor.pred"),
    ] {
        let src = binary_ptx(op, d, d, d);
        assert!(src.contains(want), "{op:?} {d}: {src}");
        assemble(&[(format!("poi_fused_{}_{d}", op.name()), src)]);
    }
    // the amount compared unsigned with the limit (so negative ones are out of range), then a
    // shift of the 64-bit register by its low word
    for (op, d, limit) in [(ShiftLeft, DType::I32, 32), (ShiftRight, DType::I64, 63), (ShiftRight, DType::U8, 8)] {
        let src = binary_ptx(op, d, d, d);
        let instr = if op == ShiftLeft { "shl.b64" } else { "shr.s64" };
        assert!(src.contains(instr) && src.contains(&format!(", {limit};")), "{op:?} {d}: {src}");
        assert!(src.contains("setp.lt.u64") && src.contains("cvt.u32.u64"), "{op:?} {d}: {src}");
        assemble(&[(format!("poi_fused_{}_{d}", op.name()), src)]);
    }
    for (d, want) in [(DType::I32, "not.b64"), (DType::Bool, "not.pred")] {
        let src = unary_ptx(coil_ir::UnaryOp::BitwiseNot, d, d);
        assert!(src.contains(want), "{d}: {src}");
        assemble(&[(format!("poi_fused_bitwise_not_{d}"), src)]);
    }
}
