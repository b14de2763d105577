//! End to end through the real passes: decompose, lower and schedule (`coil-passes`), then build,
//! emit, compile and run every kernel, checking values against hand computations in f64 and the
//! kernel builder's index maps against the scheduler's.

use crate::testutil::compile;
use crate::{build_kernel, emit_c, status};
use coil_ir::kernel::{KernelKind, TileKernel};
use coil_ir::{BinaryOp, DType, Graph, LossReduction, NodeId, Op, TensorMeta};

fn m(shape: &[usize], d: DType) -> TensorMeta {
    TensorMeta::new(shape.to_vec(), d)
}

fn op(g: &mut Graph, o: Op, inputs: &[NodeId]) -> NodeId {
    g.push(o, inputs, None).unwrap()
}

/// Bytes of a slice of plain numbers.
fn bytes<T: Copy>(v: &[T]) -> Vec<u8> {
    let n = std::mem::size_of_val(v);
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, n) }.to_vec()
}

fn f32s(b: &[u8]) -> Vec<f64> {
    b.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64).collect()
}

/// Compiles `g` (outputs `outputs`) and runs it on `inputs` (raw bytes, in graph input order);
/// returns the outputs' bytes and the tile kernels.
fn run(g: Graph, outputs: &[NodeId], inputs: &[Vec<u8>]) -> (Vec<Vec<u8>>, Vec<TileKernel>) {
    run_with(g, outputs, inputs, |p| p)
}

/// [`run`] with `pass` applied to the lowered program (e.g. `split_reductions`).
fn run_with(
    mut g: Graph,
    outputs: &[NodeId],
    inputs: &[Vec<u8>],
    pass: impl Fn(coil_ir::loops::LoopProgram) -> coil_ir::loops::LoopProgram,
) -> (Vec<Vec<u8>>, Vec<TileKernel>) {
    g.outputs.extend_from_slice(outputs);
    let prim = coil_passes::decompose(&g).unwrap();
    let program = pass(coil_passes::lower(&prim).unwrap());
    let sched = coil_passes::schedule(&program);
    for k in &sched.kernels {
        assert_ne!(k.kind, KernelKind::Extern, "{}: no extern calls in these tests", k.name);
        for &n in &k.nodes {
            let ours = crate::tile::node_index_map(&program, k, n);
            let theirs = coil_passes::schedule::kernel_index_map(&program, k, n);
            assert_eq!(ours, theirs, "{}: index map of node {n}", k.name);
        }
    }
    let tiles: Vec<TileKernel> = sched.kernels.iter().map(|k| build_kernel(&program, k)).collect();
    let lib = compile(&emit_c(&tiles));
    // u64 words keep every buffer 8-byte aligned
    let mut bufs: Vec<Vec<u64>> =
        program.buffers.iter().map(|b| vec![0u64; b.meta.nbytes().div_ceil(8).max(1)]).collect();
    for (id, data) in program.inputs.iter().zip(inputs) {
        assert_eq!(data.len(), program.buffer(*id).meta.nbytes());
        let dst = &mut bufs[id.0];
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst.as_mut_ptr() as *mut u8, data.len()) };
    }
    for t in &tiles {
        let args: Vec<*mut u8> = t.args.iter().map(|a| bufs[a.buffer.0].as_mut_ptr() as *mut u8).collect();
        assert_eq!(lib.run(&t.name, &args)[0], status::OK, "{}", t.name);
    }
    let outs = program
        .outputs
        .iter()
        .map(|id| {
            let n = program.buffer(*id).meta.nbytes();
            unsafe { std::slice::from_raw_parts(bufs[id.0].as_ptr() as *const u8, n) }.to_vec()
        })
        .collect();
    (outs, tiles)
}

fn data(n: usize, seed: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 7919 + seed * 104729) % 1000) as f32 / 250.0 - 2.0).collect()
}

fn assert_close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol * w.abs().max(1.0), "[{i}]: {g} vs {w}");
    }
}

fn layer_norm_ref(x: &[f32], w: &[f32], b: &[f32], cols: usize) -> Vec<f64> {
    x.chunks(cols)
        .flat_map(|row| {
            let n = cols as f64;
            let mean = row.iter().map(|&v| v as f64).sum::<f64>() / n;
            let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
            let rs = 1.0 / (var + 1e-5).sqrt();
            row.iter()
                .enumerate()
                .map(move |(c, &v)| (v as f64 - mean) * rs * w[c] as f64 + b[c] as f64)
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn residual_add_and_layer_norm() {
    for (rows, cols) in [(4, 8), (3, 1500)] {
        let mut g = Graph::new();
        let x = g.input(m(&[rows, cols], DType::F32));
        let r = g.input(m(&[rows, cols], DType::F32));
        let w = g.input(m(&[cols], DType::F32));
        let b = g.input(m(&[cols], DType::F32));
        let h = op(&mut g, Op::Binary(BinaryOp::Add), &[x, r]);
        let y = op(&mut g, Op::LayerNorm { ndim: 1, eps: 1e-5, weight: true, bias: true }, &[h, w, b]);
        let (xv, rv, wv, bv) = (data(rows * cols, 1), data(rows * cols, 2), data(cols, 3), data(cols, 4));
        let (outs, tiles) = run(g, &[h, y], &[bytes(&xv), bytes(&rv), bytes(&wv), bytes(&bv)]);
        assert_eq!(tiles.len(), 1);
        let hv: Vec<f32> = xv.iter().zip(&rv).map(|(a, b)| a + b).collect();
        assert_eq!(f32s(&outs[0]), hv.iter().map(|&v| v as f64).collect::<Vec<_>>());
        assert_close(&f32s(&outs[1]), &layer_norm_ref(&hv, &wv, &bv, cols), 1e-5);
    }
}

#[test]
fn softmax_short_and_long_rows() {
    for (rows, cols) in [(2, 5), (3, 3000)] {
        let mut g = Graph::new();
        let x = g.input(m(&[rows, cols], DType::F32));
        let y = op(&mut g, Op::Softmax { dim: 1 }, &[x]);
        let xv = data(rows * cols, 5);
        let (outs, _) = run(g, &[y], &[bytes(&xv)]);
        let want: Vec<f64> = xv.chunks(cols).flat_map(crate::testutil::softmax_ref).collect();
        assert_close(&f32s(&outs[0]), &want, 1e-6);
    }
}

#[test]
fn cross_entropy_with_gather() {
    let (n, c) = (4, 5);
    let mut g = Graph::new();
    let logits = g.input(m(&[n, c], DType::F32));
    let target = g.input(m(&[n], DType::I64));
    let ce = CrossEntropy { ignore_index: -100, reduction: LossReduction::Mean, label_smoothing: 0.0, weight: false };
    let y = op(&mut g, ce, &[logits, target]);
    let lv = data(n * c, 6);
    let tv = vec![0i64, 4, -100, 2];
    let (outs, _) = run(g, &[y], &[bytes(&lv), bytes(&tv)]);
    let mut total = 0.0;
    let mut count = 0.0;
    for (i, row) in lv.chunks(c).enumerate() {
        if tv[i] == -100 {
            continue;
        }
        let lse = row.iter().map(|&v| (v as f64).exp()).sum::<f64>().ln();
        total += lse - row[tv[i] as usize] as f64;
        count += 1.0;
    }
    assert_close(&f32s(&outs[0]), &[total / count], 1e-5);
}
use Op::CrossEntropy;

#[test]
fn gelu_in_bf16() {
    let mut g = Graph::new();
    let x = g.input(m(&[64], DType::BF16));
    let y = op(&mut g, Op::Gelu { tanh: true }, &[x]);
    let xv: Vec<u16> = data(64, 7).iter().map(|&v| half::bf16::from_f32(v).to_bits()).collect();
    let (outs, _) = run(g, &[y], &[bytes(&xv)]);
    let got: Vec<f64> = outs[0].chunks(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f64()).collect();
    let want: Vec<f64> = xv
        .iter()
        .map(|&b| {
            let x = half::bf16::from_bits(b).to_f64();
            0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh())
        })
        .collect();
    assert_close(&got, &want, 1.6e-2); // bf16 keeps 8 bits
}

/// A full sum and maximum of 70001 floats, split into chunks that overhang the row (17 of
/// 4118): the first stage's loops end where the row does (`c::narrow`), and the results are
/// the row's.
#[test]
fn split_reductions_with_an_overhanging_chunk() {
    let n = 70001;
    let mut g = Graph::new();
    let x = g.input(m(&[n], DType::F32));
    let sum = op(&mut g, Op::Reduce { op: coil_ir::ReduceOp::Sum, dims: vec![0], keepdim: false }, &[x]);
    let max = op(&mut g, Op::Reduce { op: coil_ir::ReduceOp::Max, dims: vec![0], keepdim: false }, &[x]);
    let mut xs = data(n, 3);
    xs[n - 1] = 7.5; // the maximum, in the last (overhanging) chunk
    let (outs, tiles) = run_with(g, &[sum, max], &[bytes(&xs)], |p| coil_passes::split_reductions(&p));
    let c = emit_c(&tiles);
    assert!(c.contains("rindex < coil_max(0, coil_min(4118, 70001 - (4118*xindex)))"), "{c}");
    let want_sum: f64 = xs.iter().map(|&v| v as f64).sum();
    // f32 lane sums by blocks (`c::rloop`): within their bound, which for terms that cancel
    // this much (|sum| = 132, sum |x| = 70000) is well above f32's epsilon of the result
    let magnitude: f64 = xs.iter().map(|&v| (v as f64).abs()).sum();
    let u = f32::EPSILON as f64 / 2.0;
    let bound = (crate::c::SUM_BLOCK as f64 / 8.0 + 3.0) * u * magnitude + u * want_sum.abs();
    let got = f32s(&outs[0])[0];
    assert!((got - want_sum).abs() <= bound, "{got} vs {want_sum} (bound {bound:e})");
    assert_eq!(f32s(&outs[1]), [7.5]);
}
