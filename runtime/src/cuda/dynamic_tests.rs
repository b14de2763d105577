//! Dynamic shapes on the GPU: a graph compiled once, with size symbols passed to its kernels,
//! run at several sizes (a child of the CUDA tests, sharing their helpers; skipped without a
//! GPU like them).

use super::*;
use coil_codegen::cuda::emit_cuda;
use coil_ir::kernel::FusedKernel;
use coil_ir::loops::{range_var, reduction_var, Body, LoopBuffer, ScalarOp, SizeSymbol, ValueId};
use coil_ir::{ReduceOp, Scalar};

/// A body under construction.
#[derive(Default)]
struct B(Body);

impl B {
    fn load(&mut self, b: usize, index: Expr) -> ValueId {
        self.0.push(ScalarOp::Load { buffer: BufferId(b), index }, DType::F32)
    }
    fn constant(&mut self, v: f64) -> ValueId {
        self.0.push(ScalarOp::Constant(Scalar::Float(v)), DType::F32)
    }
    fn binary(&mut self, op: BinaryOp, a: ValueId, b: ValueId) -> ValueId {
        self.0.push(ScalarOp::Binary(op, a, b), DType::F32)
    }
    fn done(mut self, result: ValueId) -> Body {
        self.0.result = result;
        self.0
    }
}

/// An f32 input `[s0, 4]` (`s0` = input 0 dim 0, hint 8) and one kernel of each shape a size
/// symbol can take, every node an output (as `coil_codegen`'s CUDA tests build it):
/// `relu(2x + 1)` (`[s0, 4]`, pointwise over `4*s0`); column sums (`[4]`, a looped reduction over
/// rows of `s0`); row sums (`[s0]`, persistent over `s0` rows of 4); `x[:, 0] - x[:, 3]` (`[s0]`,
/// pointwise with a partial last group); the sum of squares (`[1]`, one looped row of `4*s0`).
fn dynamic_graph() -> (LoopProgram, Schedule) {
    let s0 = Expr::size("s0");
    let (four, one) = (Expr::int(4), Expr::int(1));
    let hint = 8;
    let buffer = |name: String, shape: Vec<Expr>| {
        let dims: Vec<usize> = shape.iter().map(|e| e.eval(&[(s0, hint)].into()).unwrap() as usize).collect();
        LoopBuffer { name, meta: TensorMeta::new(dims, DType::F32), shape }
    };
    let mut buffers = vec![buffer("arg0".into(), vec![s0, four])];
    let (mut nodes, mut kernels) = (Vec::new(), Vec::new());
    let mut add = |name: &str, kind: KernelKind, shape: Vec<Expr>, lk: LoopKind, xnumel: Expr, rnumel: Option<Expr>| {
        let out = BufferId(buffers.len());
        buffers.push(buffer(format!("buf{}", out.0), shape));
        let stores = vec![out];
        kernels.push(FusedKernel { name: name.into(), kind, nodes: vec![nodes.len()], xnumel, rnumel, stores });
        nodes.push(LoopNode { output: out, origins: vec!["test"], kind: lk });
    };
    let (x0, x1) = (range_var(0, &s0), range_var(1, &four));
    let mut b = B::default();
    let (l, two, c1, zero) = (b.load(0, x0 * 4 + x1), b.constant(2.0), b.constant(1.0), b.constant(0.0));
    let m = b.binary(BinaryOp::Mul, l, two);
    let a = b.binary(BinaryOp::Add, m, c1);
    let r = b.binary(BinaryOp::Maximum, a, zero);
    let lk = LoopKind::Pointwise { ranges: vec![s0, four], body: b.done(r), scatter: None };
    add("poi_fused_relu_0", KernelKind::Pointwise, vec![s0, four], lk, s0 * 4, None);

    let (x0, r0) = (range_var(0, &four), reduction_var(0, &s0));
    let mut b = B::default();
    let l = b.load(0, r0 * 4 + x0);
    let lk = LoopKind::Reduction { ranges: vec![four], reduction_ranges: vec![s0], op: ReduceOp::Sum, body: b.done(l) };
    add("red_fused_sum_1", KernelKind::LoopedReduction, vec![four], lk, four, Some(s0));

    let (x0, r0) = (range_var(0, &s0), reduction_var(0, &four));
    let mut b = B::default();
    let l = b.load(0, x0 * 4 + r0);
    let lk = LoopKind::Reduction { ranges: vec![s0], reduction_ranges: vec![four], op: ReduceOp::Sum, body: b.done(l) };
    add("per_fused_sum_2", KernelKind::PersistentReduction, vec![s0], lk, s0, Some(four));

    let x0 = range_var(0, &s0);
    let mut b = B::default();
    let (p, q) = (b.load(0, x0 * 4), b.load(0, x0 * 4 + 3));
    let d = b.binary(BinaryOp::Sub, p, q);
    let lk = LoopKind::Pointwise { ranges: vec![s0], body: b.done(d), scatter: None };
    add("poi_fused_sub_3", KernelKind::Pointwise, vec![s0], lk, s0, None);

    let r0 = reduction_var(0, &(s0 * 4));
    let mut b = B::default();
    let l = b.load(0, r0);
    let sq = b.binary(BinaryOp::Mul, l, l);
    let lk =
        LoopKind::Reduction { ranges: vec![one], reduction_ranges: vec![s0 * 4], op: ReduceOp::Sum, body: b.done(sq) };
    add("red_fused_sum_4", KernelKind::LoopedReduction, vec![one], lk, one, Some(s0 * 4));

    let program = LoopProgram {
        symbols: vec![SizeSymbol { symbol: s0, input: 0, dim: 0, hint }],
        data_checks: vec![],
        outputs: (1..buffers.len()).map(BufferId).collect(),
        buffers,
        inputs: vec![BufferId(0)],
        nodes,
    };
    (program, Schedule { kernels, ..Default::default() })
}

/// The outputs of [`dynamic_graph`] for `x` (`[rows, 4]`), in f64.
fn reference(x: &[f64], rows: usize) -> Vec<Vec<f64>> {
    let at = |r: usize, c: usize| x[4 * r + c];
    vec![
        x.iter().map(|v| (2.0 * v + 1.0).max(0.0)).collect(),
        (0..4).map(|c| (0..rows).map(|r| at(r, c)).sum()).collect(),
        (0..rows).map(|r| (0..4).map(|c| at(r, c)).sum()).collect(),
        (0..rows).map(|r| at(r, 0) - at(r, 3)).collect(),
        vec![x.iter().map(|v| v * v).sum()],
    ]
}

#[test]
fn one_compiled_graph_runs_at_every_size() {
    let (program, schedule) = dynamic_graph();
    let tiles: Vec<Option<TileKernel>> =
        schedule.kernels.iter().map(|k| Some(coil_codegen::build_kernel(&program, k))).collect();
    let generated: Vec<TileKernel> = tiles.iter().flatten().cloned().collect();
    let module = emit_cuda(&generated).unwrap();
    // Every kernel takes s0; the grids of a symbolic xnumel are left to each run.
    assert!(generated.iter().all(|t| t.sizes == vec![Expr::size("s0")]));
    let grids: Vec<u32> = module.kernels.iter().map(|k| k.launch.grid).collect();
    assert_eq!(grids, vec![0, 4, 0, 0, 1]);
    let Some(dev) = gpu() else { return };
    let dir = TempDir::new("dynamic");
    let g = CudaCompiledGraph::new_in(dev.clone(), program, schedule, tiles, std::slice::from_ref(&module), &dir.0)
        .unwrap();
    // Dumps show the grids at the hint (s0 = 8).
    let attrs: Vec<u32> = g.kernel_attributes().iter().map(|a| a.grid).collect();
    assert_eq!(attrs, vec![1, 4, 1, 1, 1]);
    // s0 = 300001: grids of many blocks (1172 of 4 x 256 elements, 37501 of 8 rows, ...).
    for (n, rows) in [2usize, 3, 17, 1000, 300_001, 17].into_iter().enumerate() {
        let xs = randoms(100 + n as u64, rows * 4);
        let x = Buffer::new(vec![rows, 4], HostData::from_f64_slice(DType::F32, &xs)).unwrap();
        let xs = x.data.to_f64_vec(); // the f32 values
        let out = g.run_host(&[&x]).unwrap();
        let shapes: Vec<Vec<usize>> = out.iter().map(|b| b.shape.to_vec()).collect();
        assert_eq!(shapes, vec![vec![rows, 4], vec![4], vec![rows], vec![rows], vec![1]], "s0 = {rows}");
        for (k, (got, want)) in out.iter().zip(reference(&xs, rows)).enumerate() {
            assert_close(&got.data.to_f64_vec(), &want, 1e-5, &format!("s0 = {rows}, output {k}"));
        }
    }
    // Device buffers and timing at one size.
    let x = CudaBuffer::from_host(&dev, &Buffer::from_vec(vec![0.5f32; 4 * 33], vec![33, 4])).unwrap();
    assert_eq!(g.time_runs(&[&x], 1, 2).unwrap().len(), 2);
    // Sizes the program does not take: a symbol below 2, a static dim that differs.
    for shape in [vec![1, 4], vec![5, 3]] {
        let n = shape.iter().product();
        let e = g.run_host(&[&Buffer::from_vec(vec![0f32; n], shape.clone())]).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Shape, "{shape:?}: {}", e.message);
    }
}
