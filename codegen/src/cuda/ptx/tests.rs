//! The PTX emitter's unit tests: what needs Rust rather than a text check. The generated PTX of
//! each special case (division by constants, reciprocal multiplies, packed and vector stores,
//! loads first, the math routines, Philox, f16/bf16 conversions, signed zeros, the status
//! word's compare-and-swap, reductions through shuffles, shared and distributed shared memory)
//! is checked as text by the `tests/filetests/ptx_*.coil` filetests. Here: snapshots of the
//! classic kernels (read them beside the CUDA C ones), the driver assembler's level, which
//! shapes have a PTX form, the division magic over many divisors, and an assembly check with
//! `ptxas` where one is installed (`COIL_PTXAS`, or `ptxas` on the `PATH`; the GPU tests run
//! the kernels).

use super::*;
use crate::cuda::tests::{all_kernels, col_mean, col_sum, layer_norm};
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

/// The whole PTX of the classic kernels, to read and to review in diffs (their special cases
/// are checked by the filetests of the same kernels: `ptx_cache_write.coil`,
/// `ptx_pointwise_bf16.coil`, `ptx_layer_norm.coil`, `ptx_softmax_looped.coil`,
/// `ptx_column_mean_vectors.coil`, `ptx_argmax_block.coil`).
#[test]
fn classic_kernels_snapshots() {
    let cases = [
        ("ptx_cache_write", crate::tile::tests::cache_write()),
        ("ptx_pointwise_bf16", crate::tile::tests::pointwise_chain(DType::BF16)),
        ("ptx_layer_norm", layer_norm(37, 1536, KernelKind::PersistentReduction)),
        ("ptx_softmax_looped", softmax(3, 2000, KernelKind::LoopedReduction, "red_fused_softmax_0")),
        ("ptx_col_mean_vectors", col_mean(300, 8192)),
        ("ptx_argmax_block", crate::tile::tests::argmax(4, 3000)),
    ];
    for (name, (p, k)) in cases {
        snapshot(name, ptx(&build_kernel(&p, &k)));
    }
}

/// On sm_90 every kernel waits for the grid before it (it may be launched as a programmatic
/// dependent) before its first global access; on sm_80 there is no such instruction.
#[test]
fn kernels_wait_for_the_previous_grid_before_touching_memory_on_sm_90() {
    let mut checked = 0;
    for kernel in all_kernels() {
        let Ok(module) = emit_ptx(&kernel, &GpuTarget::h100(), &Tuning::default()) else { continue };
        checked += 1;
        let hopper = module.source;
        let wait = hopper.find("griddepcontrol.wait;").unwrap_or_else(|| panic!("{}: no wait", kernel.name));
        let first_access = ["ld.global", "st.global", "atom.global", "red.global"]
            .iter()
            .filter_map(|i| hopper.find(i))
            .min()
            .unwrap_or(usize::MAX);
        assert!(wait < first_access, "{}: memory is touched before the wait", kernel.name);
        assert!(hopper[..wait].contains("griddepcontrol.launch_dependents;"), "{}", kernel.name);
        let ampere = emit_ptx(&kernel, &GpuTarget::a100(), &Tuning::default()).map(|m| m.source).unwrap_or_default();
        assert!(!ampere.contains("griddepcontrol"), "{}: sm_80 has no dependent launches", kernel.name);
    }
    assert!(checked >= 10, "only {checked} kernels have a PTX form");
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
}

/// Every PTX module of [`all_kernels`] through `ptxas -arch=sm_90`, where it is installed
/// (`COIL_PTXAS`, or `ptxas` on the `PATH`); reported as skipped where it is not. (The
/// filetests' modules go through it in `tests/filetests.rs`.)
#[test]
fn every_module_assembles_where_ptxas_is_installed() {
    let ptxas = std::env::var("COIL_PTXAS").unwrap_or_else(|_| "ptxas".into());
    if std::process::Command::new(&ptxas).arg("--version").output().is_err() {
        coil_ir::testing::skip(format!("no ptxas ({ptxas}); set COIL_PTXAS to check the PTX assembles"));
        return;
    }
    let dir = std::env::temp_dir().join(format!("coil_ptx_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for k in &all_kernels() {
        let Ok(module) = emit_ptx(k, &GpuTarget::h100(), &Tuning::default()) else { continue };
        let path = dir.join(format!("{}.ptx", k.name));
        std::fs::write(&path, module.source).unwrap();
        let out = std::process::Command::new(&ptxas)
            .args(["-arch=sm_90", "-o"])
            .arg(dir.join(format!("{}.cubin", k.name)))
            .arg(&path)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}: {}", k.name, String::from_utf8_lossy(&out.stderr));
    }
    let _ = std::fs::remove_dir_all(&dir);
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
}
