//! The CPU backend with size symbols (dynamic shapes): one compile, runs at many sizes.

use super::tests::{cc, randoms, TempDir};
use super::*;
use crate::test_graphs::buffer_e;
use coil_ir::kernel::KernelKind;
use coil_ir::loops::{
    range_var, reduction_var, Bindings, Body, LoopBuffer, LoopNode, ScalarOp, SizeSymbol, StridedOperand,
};
use coil_ir::sym::Expr;
use coil_ir::{BinaryOp, DType, ErrorKind, Op, ReduceOp, UnaryOp};

/// With `s0 = arg0.size(0)` (hint 8), `arg0: f32[s0, 4]`, `arg1: f32[4, 3]`:
///
/// * `buf2[s0, 4] = exp(arg0) + 1` (output);
/// * `buf3[s0] = sum(buf2, dim=1)` (rows of 4; output);
/// * `buf4[4] = amax(arg0, dim=0)` (rows of `s0`: a looped reduction; output);
/// * `buf5[s0, 4] = arg0 * 2` (a temporary: the bmm operand, in a memory-plan slot);
/// * `buf6[s0, 3] = buf5 @ arg1` (extern bmm with `m = s0`; output);
/// * `buf7[s0, 3] = cumsum(buf6, dim=0)` (fallback; output).
fn dynamic_program() -> LoopProgram {
    let f = DType::F32;
    let s0 = Expr::size("s0");
    let (four, three) = (Expr::int(4), Expr::int(3));
    let symbols = vec![SizeSymbol { symbol: s0, input: 0, dim: 0, hint: 8 }];
    let hints: Bindings = symbols.iter().map(|s| (s.symbol, s.hint)).collect();
    let shapes = [vec![s0, four], vec![four, three], vec![s0, four], vec![s0], vec![four], vec![s0, four]];
    let mut buffers: Vec<LoopBuffer> =
        shapes.iter().enumerate().map(|(i, s)| buffer_e(&format!("buf{i}"), s, f, &hints)).collect();
    buffers.push(buffer_e("buf6", &[s0, three], f, &hints));
    buffers.push(buffer_e("buf7", &[s0, three], f, &hints));
    buffers[0].name = "arg0".into();
    buffers[1].name = "arg1".into();
    let xs = |ranges: &[Expr]| ranges.iter().enumerate().map(|(i, e)| range_var(i, e)).collect::<Vec<_>>();
    let (x, r) = (xs(&[s0, four]), reduction_var(0, &four));

    let mut b = Body::default();
    let l = b.push(ScalarOp::Load { buffer: BufferId(0), index: x[0] * 4 + x[1] }, f);
    let e = b.push(ScalarOp::Unary(UnaryOp::Exp, l), f);
    let one = b.push(ScalarOp::Constant(1.0f32.into()), f);
    b.result = b.push(ScalarOp::Binary(BinaryOp::Add, e, one), f);
    let exp = LoopKind::Pointwise { ranges: vec![s0, four], body: b, scatter: None };

    let mut b = Body::default();
    b.result = b.push(ScalarOp::Load { buffer: BufferId(2), index: range_var(0, &s0) * 4 + r }, f);
    let sum = LoopKind::Reduction { ranges: vec![s0], reduction_ranges: vec![four], op: ReduceOp::Sum, body: b };

    let mut b = Body::default();
    b.result =
        b.push(ScalarOp::Load { buffer: BufferId(0), index: reduction_var(0, &s0) * 4 + range_var(0, &four) }, f);
    let amax = LoopKind::Reduction { ranges: vec![four], reduction_ranges: vec![s0], op: ReduceOp::Max, body: b };

    let mut b = Body::default();
    let l = b.push(ScalarOp::Load { buffer: BufferId(0), index: x[0] * 4 + x[1] }, f);
    let two = b.push(ScalarOp::Constant(2.0f32.into()), f);
    b.result = b.push(ScalarOp::Binary(BinaryOp::Mul, l, two), f);
    let mul = LoopKind::Pointwise { ranges: vec![s0, four], body: b, scatter: None };

    let operand = |buffer: usize, row: i64| StridedOperand {
        buffer: BufferId(buffer),
        offset: Expr::int(0),
        batch_strides: vec![],
        row_stride: Expr::int(row),
        col_stride: Expr::int(1),
    };
    let bmm = LoopKind::Extern {
        call: ExternCall::Bmm {
            a: operand(5, 4),
            b: operand(1, 3),
            bias: None,
            activation: None,
            activation_grad: None,
            saved: None,
            batch: vec![],
            m: s0,
            n: three,
            k: four,
        },
        inputs: vec![BufferId(5), BufferId(1)],
    };
    let cumsum =
        LoopKind::Extern { call: ExternCall::Fallback { op: Op::Cumsum { dim: 0 } }, inputs: vec![BufferId(6)] };

    let nodes =
        [(2, "exp", exp), (3, "sum", sum), (4, "amax", amax), (5, "mul", mul), (6, "bmm", bmm), (7, "cumsum", cumsum)]
            .into_iter()
            .map(|(out, origin, kind)| LoopNode { output: BufferId(out), origins: vec![origin], kind })
            .collect();
    LoopProgram {
        symbols,
        buffers,
        inputs: vec![BufferId(0), BufferId(1)],
        outputs: [2, 3, 4, 6, 7].map(BufferId).to_vec(),
        nodes,
        data_checks: vec![],
    }
}

/// The outputs of [`dynamic_program`] computed in Rust (f64), for `arg0` of `n` rows.
fn reference(x: &[f32], w: &[f32], n: usize) -> Vec<Vec<f64>> {
    let x: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    let exp: Vec<f64> = x.iter().map(|v| v.exp() + 1.0).collect();
    let sums = (0..n).map(|i| exp[4 * i..4 * i + 4].iter().sum()).collect();
    let amax = (0..4).map(|j| (0..n).map(|i| x[4 * i + j]).fold(f64::NEG_INFINITY, f64::max)).collect();
    let mm: Vec<f64> =
        (0..n * 3).map(|o| (0..4).map(|k| 2.0 * x[4 * (o / 3) + k] * w[3 * k + o % 3] as f64).sum()).collect();
    let mut cum = mm.clone();
    for o in 3..n * 3 {
        cum[o] += cum[o - 3];
    }
    vec![exp, sums, amax, mm, cum]
}

fn compile(dir: &Path) -> CompiledGraph {
    let program = dynamic_program();
    let schedule = coil_passes::schedule(&program);
    let tiles: Vec<Option<TileKernel>> = schedule
        .kernels
        .iter()
        .map(|k| (k.kind != KernelKind::Extern).then(|| coil_codegen::build_kernel(&program, k)))
        .collect();
    let source = coil_codegen::emit_c(&tiles.iter().flatten().cloned().collect::<Vec<_>>());
    CompiledGraph::new_in(program, schedule, tiles, &source, dir).unwrap()
}

fn inputs(n: usize) -> (Buffer, Buffer) {
    let x: Vec<f32> = randoms(n as u64, 4 * n).iter().map(|&v| v as f32).collect();
    let w: Vec<f32> = randoms(99, 12).iter().map(|&v| v as f32).collect();
    (Buffer::from_vec(x, vec![n, 4]), Buffer::from_vec(w, vec![4, 3]))
}

fn check_run(g: &CompiledGraph, n: usize) {
    let (x, w) = inputs(n);
    let got = g.run(&[&x, &w]).unwrap();
    let want = reference(&x.to_vec::<f32>(), &w.to_vec::<f32>(), n);
    let shapes = [vec![n, 4], vec![n], vec![4], vec![n, 3], vec![n, 3]];
    assert_eq!(got.len(), 5);
    for (k, ((g, w), shape)) in got.iter().zip(&want).zip(shapes).enumerate() {
        assert_eq!(g.shape, shape, "s0 = {n}, output {k}");
        for (i, (a, b)) in g.data.to_f64_vec().iter().zip(w).enumerate() {
            assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "s0 = {n}, output {k}[{i}]: {a} vs {b}");
        }
    }
}

#[test]
fn one_compile_runs_at_every_size() {
    let Some(_) = cc() else { return };
    let dir = TempDir::new("dynamic");
    let g = compile(&dir.0);
    let sized: Vec<&TileKernel> = g.tiles.iter().flatten().filter(|t| !t.sizes.is_empty()).collect();
    assert!(!sized.is_empty() && sized.iter().all(|t| t.sizes == [Expr::size("s0")]), "{:?}", g.tiles);
    let slotted = g.schedule.memory.slot_of.iter().any(|s| s.is_some());
    assert!(slotted, "buf5 lives in a memory-plan slot: {:?}", g.schedule.memory);
    // 100 rows: the temporary outgrows the slot planned at the hint (8 rows).
    for n in [2, 3, 17, 100, 3, 8] {
        check_run(&g, n);
    }
    // Several threads at several sizes share the cache of instances.
    std::thread::scope(|s| {
        for n in [5, 6, 5, 200] {
            let g = &g;
            s.spawn(move || check_run(g, n));
        }
    });
    // The same source again: the cache has it.
    assert!(compile(&dir.0).cache_hit());
}

#[test]
fn inputs_that_do_not_bind_are_shape_errors() {
    let Some(_) = cc() else { return };
    let dir = TempDir::new("dynamic-bad");
    let g = compile(&dir.0);
    let (x, w) = inputs(5);
    let run = |a: &Buffer, b: &Buffer| g.run(&[a, b]).unwrap_err();
    let e = run(&Buffer::from_vec(vec![0f32; 15], vec![5, 3]), &w);
    assert_eq!(e.kind, ErrorKind::Shape);
    assert!(e.message.contains("input 0: expected shape [s0, 4], got [5, 3]"), "{e}");
    let e = run(&x, &Buffer::from_vec(vec![0f32; 16], vec![4, 4]));
    assert_eq!(e.kind, ErrorKind::Shape);
    assert!(e.message.contains("input 1: expected shape [4, 3]"), "{e}");
    // Sizes 0 and 1 are specialized: a symbol is at least 2.
    let (one, _) = inputs(1);
    let e = run(&one, &w);
    assert_eq!(e.kind, ErrorKind::Shape);
    assert!(e.message.contains("s0 = 1") && e.message.contains("at least 2"), "{e}");
    let e = run(&Buffer::from_vec(Vec::<f32>::new(), vec![0, 4]), &w);
    assert_eq!(e.kind, ErrorKind::Shape, "{e}");
    // Wrong rank (the symbol's dim is missing), wrong dtype, wrong count.
    assert_eq!(run(&Buffer::from_vec(vec![0f32; 1], vec![]), &w).kind, ErrorKind::Shape);
    assert_eq!(run(&Buffer::from_vec(vec![0f64; 20], vec![5, 4]), &w).kind, ErrorKind::DType);
    assert_eq!(g.run(&[&x]).unwrap_err().kind, ErrorKind::Value);
    // Still fine afterwards.
    check_run(&g, 5);
}
