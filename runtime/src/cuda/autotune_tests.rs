//! The launch autotuner: its cache of choices (no GPU needed) and, on a GPU, tuned graphs
//! against the heuristic's plans.

use super::tests::{assert_close, gpu, randoms, TempDir};
use super::*;
use crate::test_graphs::buffer;
use coil_ir::kernel::KernelKind;
use coil_ir::loops::LoopNode;
use coil_ir::sym::Expr;
use coil_ir::{BinaryOp, DType};

#[test]
fn autotune_choices_round_trip_through_the_cache() {
    use autotune::{choice_key, choice_path, read_choice, winner, write_choice};
    use coil_codegen::cuda::Tuning;
    let dir = TempDir::new("autotune-cache");
    let key = choice_key("src", "sm_90", "NVIDIA H100", &[]);
    assert_eq!(key.len(), 32);
    assert_eq!(key, choice_key("src", "sm_90", "NVIDIA H100", &[]));
    // the key follows the source, the architecture, the GPU and the run's sizes
    for other in [
        choice_key("src2", "sm_90", "NVIDIA H100", &[]),
        choice_key("src", "sm_80", "NVIDIA H100", &[]),
        choice_key("src", "sm_90", "NVIDIA H200", &[]),
        choice_key("src", "sm_90", "NVIDIA H100", &[8]),
    ] {
        assert_ne!(key, other);
    }
    assert_ne!(choice_key("src", "sm_90", "g", &[8, 16]), choice_key("src", "sm_90", "g", &[81, 6]));
    // nothing cached yet; then the choice, on a readable first line
    assert_eq!(read_choice(&dir.0, &key), None);
    let t = Tuning { looped_threads: Some(512), ..Tuning::default() };
    write_choice(&dir.0, &key, &t, "k on sm_90: heuristic 10.0 us, looped_threads=512 9.0 us").unwrap();
    assert_eq!(read_choice(&dir.0, &key), Some(t));
    let path = choice_path(&dir.0, &key);
    assert_eq!(path, dir.0.join("autotune").join(format!("{key}.choice.entry")));
    // a verified cache entry whose payload is the choice, then the timings
    let text = crate::cache_entry::read(&path, crate::cache_entry::Kind::Choice, &key);
    let want = "looped_threads=512\n# k on sm_90: heuristic 10.0 us, looped_threads=512 9.0 us\n";
    assert_eq!(text, crate::cache_entry::Lookup::Found(want.as_bytes().to_vec()));
    // the heuristic's plan is a choice too
    write_choice(&dir.0, &key, &Tuning::default(), "kept").unwrap();
    assert_eq!(read_choice(&dir.0, &key), Some(Tuning::default()));
    // none from a damaged entry, another kernel's, or one that names no tuning (all logged)
    let mut damaged = std::fs::read(&path).unwrap();
    *damaged.last_mut().unwrap() ^= 1;
    std::fs::write(&path, &damaged).unwrap();
    assert_eq!(read_choice(&dir.0, &key), None);
    let other = choice_key("src2", "sm_90", "NVIDIA H100", &[]);
    write_choice(&dir.0, &other, &t, "another kernel's").unwrap();
    std::fs::copy(choice_path(&dir.0, &other), &path).unwrap();
    assert_eq!(read_choice(&dir.0, &key), None);
    crate::cache_entry::write(&path, crate::cache_entry::Kind::Choice, &key, b"faster please\n").unwrap();
    assert_eq!(read_choice(&dir.0, &key), None);
    std::fs::write(&path, "looped_threads=512\n").unwrap();
    assert_eq!(read_choice(&dir.0, &key), None, "a bare choice (no entry header) is not trusted");

    // The fastest wins by more than 2%; else, and when the heuristic failed, it stays.
    let row = |n: usize| Tuning { row_threads: Some(n), ..Tuning::default() };
    let timed = |times: &[Option<f64>]| -> Vec<(Tuning, Option<f64>)> {
        times.iter().enumerate().map(|(i, t)| (if i == 0 { Tuning::default() } else { row(64 * i) }, *t)).collect()
    };
    assert_eq!(winner(&timed(&[Some(10.0), Some(9.0), Some(9.5)])), Some(1));
    assert_eq!(winner(&timed(&[Some(10.0), Some(9.9), None])), Some(0));
    assert_eq!(winner(&timed(&[Some(10.0), None, Some(7.0)])), Some(2));
    assert_eq!(winner(&timed(&[None, Some(1.0)])), None);
}

/// `softmax(x, dim=-1)` of two f32 inputs, each one kernel of `kind` (the row maxima and sums
/// stay in registers): `[rows, cols]` for each `(rows, cols, kind)`, outputs in order.
fn softmax_graph(shapes: &[(usize, usize, KernelKind)]) -> (LoopProgram, Schedule) {
    use coil_ir::kernel::FusedKernel;
    use coil_ir::loops::{range_var, reduction_var, Body, ScalarOp};
    use coil_ir::{ReduceOp, UnaryOp};
    let f = DType::F32;
    let mut buffers: Vec<_> =
        (shapes.iter().enumerate()).map(|(i, &(rows, cols, _))| buffer(&format!("arg{i}"), &[rows, cols], f)).collect();
    let (mut nodes, mut kernels, mut outputs) = (Vec::new(), Vec::new(), Vec::new());
    for (i, &(rows, cols, kind)) in shapes.iter().enumerate() {
        let first = nodes.len();
        let (x, r, c) = (BufferId(i), Expr::from(rows), Expr::from(cols));
        let mut node = |buffers: &mut Vec<_>, shape: &[usize], kind: LoopKind| {
            let out = BufferId(buffers.len());
            buffers.push(buffer(&format!("buf{}", out.0), shape, f));
            nodes.push(LoopNode { output: out, origins: vec!["softmax"], kind });
            out
        };
        let reduction =
            |op: ReduceOp, body: Body| LoopKind::Reduction { ranges: vec![r], reduction_ranges: vec![c], op, body };
        // amax, then the sum of exp(x - amax), then exp(x - amax) / sum
        let (xv, rv) = (range_var(0, &r), reduction_var(0, &c));
        let mut b = Body::default();
        b.result = b.push(ScalarOp::Load { buffer: x, index: xv * cols as i64 + rv }, f);
        let amax = node(&mut buffers, &[rows], reduction(ReduceOp::Max, b));
        let shifted_exp = |b: &mut Body, row: Expr, col: Expr| {
            let l = b.push(ScalarOp::Load { buffer: x, index: row * cols as i64 + col }, f);
            let m = b.push(ScalarOp::Load { buffer: amax, index: row }, f);
            let d = b.push(ScalarOp::Binary(BinaryOp::Sub, l, m), f);
            b.push(ScalarOp::Unary(UnaryOp::Exp, d), f)
        };
        let mut b = Body::default();
        b.result = shifted_exp(&mut b, xv, rv);
        let sum = node(&mut buffers, &[rows], reduction(ReduceOp::Sum, b));
        let (x0, x1) = (range_var(0, &r), range_var(1, &c));
        let mut b = Body::default();
        let e = shifted_exp(&mut b, x0, x1);
        let s = b.push(ScalarOp::Load { buffer: sum, index: x0 }, f);
        b.result = b.push(ScalarOp::Binary(BinaryOp::Div, e, s), f);
        let out = node(&mut buffers, &[rows, cols], LoopKind::Pointwise { ranges: vec![r, c], body: b, scatter: None });
        let prefix = if kind == KernelKind::LoopedReduction { "red" } else { "per" };
        kernels.push(FusedKernel {
            name: format!("{prefix}_fused_softmax_{i}"),
            kind,
            nodes: vec![first, first + 1, first + 2],
            xnumel: r,
            rnumel: Some(c),
            stores: vec![out],
        });
        outputs.push(out);
    }
    let inputs = (0..shapes.len()).map(BufferId).collect();
    (
        LoopProgram { symbols: vec![], buffers, inputs, outputs, nodes, data_checks: vec![] },
        Schedule { kernels, ..Default::default() },
    )
}

/// A softmax of rows a block holds (a persistent kernel of 256 threads per row) and one of rows
/// it loops over, tuned on the first run: the outputs are the untuned graph's (up to the order
/// of the sums), the choices are cached, and a second graph takes them from the cache. Then
/// every candidate of each kernel, forced through the cache, computes the same outputs.
/// Candidates are emitted in the language of the kernel they replace: CUDA C for a kernel
/// compiled from CUDA C, PTX for a PTX kernel (no GPU needed).
#[test]
fn candidates_are_in_the_language_of_the_kernel_they_replace() {
    use coil_codegen::cuda::{launch, GpuTarget, Language};
    let (program, schedule) = softmax_graph(&[(64, 2048, KernelKind::PersistentReduction)]);
    let tile = coil_codegen::build_kernel(&program, &schedule.kernels[0]);
    let target = GpuTarget::h100();
    let candidates = launch::candidates(&tile, &target);
    assert!(candidates.len() > 1);
    for t in &candidates {
        let c = autotune::emit_in(Language::CudaC, &tile, &target, t).unwrap();
        assert_eq!(c.language, Language::CudaC, "{t}");
        let p = autotune::emit_in(Language::Ptx { level: 4 }, &tile, &target, t).unwrap();
        assert!(matches!(p.language, Language::Ptx { .. }), "{t}: {:?}", p.language);
        assert_eq!(c.kernels[0].launch, p.kernels[0].launch, "{t}: one plan in both languages");
    }
}

#[test]
fn autotuned_softmax_matches_the_heuristic_plans() {
    use coil_codegen::cuda::{emit_cuda_with, launch, GpuTarget, Tuning};
    let shapes = [(64, 2048, KernelKind::PersistentReduction), (16, 10000, KernelKind::LoopedReduction)];
    let (program, schedule) = softmax_graph(&shapes);
    let tiles: Vec<Option<TileKernel>> =
        schedule.kernels.iter().map(|k| Some(coil_codegen::build_kernel(&program, k))).collect();
    // each kernel has alternatives to time
    assert!(tiles.iter().flatten().all(|t| launch::candidates(t, &GpuTarget::h100()).len() > 1));
    let Some(dev) = gpu() else { return };
    let target = dev.target();
    let unit = |t: &TileKernel, tuning: &Tuning| emit_cuda_with(std::slice::from_ref(t), tuning, target).unwrap();
    let units: Vec<CudaModule> = tiles.iter().flatten().map(|t| unit(t, &Tuning::default())).collect();
    if !Tuning::configured().is_heuristic() {
        eprintln!(
            "skipped: the configuration's tuning overrides are set ({}), so nothing is tuned",
            Tuning::configured()
        );
        return;
    }
    let dir = TempDir::new("autotune");
    let graph = |on: bool| {
        CudaCompiledGraph::new_in(dev.clone(), program.clone(), schedule.clone(), tiles.clone(), &units, &dir.0)
            .unwrap()
            .with_autotune(on)
    };
    let inputs: Vec<Buffer> = (shapes.iter().enumerate())
        .map(|(i, &(rows, cols, _))| {
            // values up to 8 apart: exp(x - max) spans a few thousand
            let x: Vec<f64> = randoms(40 + i as u64, rows * cols).iter().map(|v| 4.0 * v).collect();
            Buffer::new(vec![rows, cols], HostData::from_f64_slice(DType::F32, &x)).unwrap()
        })
        .collect();
    let refs: Vec<&Buffer> = inputs.iter().collect();
    let check = |got: &[Buffer], want: &[Buffer], what: &str| {
        for (k, (g, w)) in got.iter().zip(want).enumerate() {
            assert_eq!(g.shape, w.shape, "{what}, output {k}");
            assert_close(&g.data.to_f64_vec(), &w.data.to_f64_vec(), 1e-5, &format!("{what}, output {k}"));
        }
    };
    let plain = graph(false);
    let want = plain.run_host(&refs).unwrap();
    assert!(plain.autotune_choices().is_empty());

    let tuned = graph(true);
    assert!(tuned.autotune_choices().is_empty(), "nothing is tuned before the first run");
    check(&tuned.run_host(&refs).unwrap(), &want, "the tuning run");
    let choices = tuned.autotune_choices().to_vec();
    for c in &choices {
        eprintln!("autotune: {} -> {} ({:?})", c.kernel, c.tuning, c.timings);
    }
    let names: Vec<&str> = choices.iter().map(|c| c.kernel.as_str()).collect();
    assert_eq!(names, ["per_fused_softmax_0", "red_fused_softmax_1"]);
    for (c, t) in choices.iter().zip(tiles.iter().flatten()) {
        assert!(!c.cached);
        let timed: Vec<Tuning> = c.timings.iter().map(|(t, _)| *t).collect();
        assert_eq!(timed, launch::candidates(t, target), "{}", c.kernel);
        // every candidate ran without error
        assert!(c.timings.iter().all(|(_, us)| us.is_some_and(|us| us > 0.0 && us < 1e6)), "{c:?}");
        assert!(timed.contains(&c.tuning));
    }
    // later runs launch the choices: the same outputs, and timing works
    check(&tuned.run_host(&refs).unwrap(), &want, "a later run");
    let devs: Vec<CudaBuffer> = inputs.iter().map(|b| CudaBuffer::from_host(&dev, b).unwrap()).collect();
    assert_eq!(tuned.time_runs(&devs.iter().collect::<Vec<_>>(), 1, 3).unwrap().len(), 3);
    let files = std::fs::read_dir(dir.0.join("autotune")).unwrap().count();
    assert_eq!(files, 2);

    // A second graph (as a second process would) takes the choices from the cache.
    let again = graph(true);
    check(&again.run_host(&refs).unwrap(), &want, "the cached choices");
    let cached: Vec<(String, Tuning, bool)> =
        again.autotune_choices().iter().map(|c| (c.kernel.clone(), c.tuning, c.cached)).collect();
    let first: Vec<(String, Tuning, bool)> = choices.iter().map(|c| (c.kernel.clone(), c.tuning, true)).collect();
    assert_eq!(cached, first);
    assert!(again.autotune_choices().iter().all(|c| c.timings.is_empty()));

    // Every candidate, forced as the cached choice, computes the same outputs.
    for (k, tile) in tiles.iter().flatten().enumerate() {
        let source = unit(tile, &Tuning::default()).source;
        let key = autotune::choice_key(&source, &dev.arch(), dev.name(), &[]);
        for t in launch::candidates(tile, target) {
            autotune::write_choice(&dir.0, &key, &t, "forced by the test").unwrap();
            let g = graph(true);
            check(&g.run_host(&refs).unwrap(), &want, &format!("{} with {t}", tile.name));
            assert_eq!(g.autotune_choices()[k].tuning, t);
            // the attributes (summary.json, COIL_PROFILE) describe the launch as it ran
            let a = &g.kernel_attributes()[k];
            let want_block = unit(tile, &t).kernels[0].launch.block;
            assert_eq!(a.block, want_block, "{} with {t}", tile.name);
            assert_eq!(a.tuning, (!t.is_heuristic()).then(|| t.to_string()), "{} with {t}", tile.name);
        }
    }
}
