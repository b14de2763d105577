//! Small loop programs, schedules and tile-kernel signatures for the backends' tests (the CPU
//! and CUDA tests build the same graphs around hand-written kernels).

use coil_ir::kernel::{FusedKernel, KernelKind, Schedule, TileArg, TileKernel};
use coil_ir::loops::{
    Bindings, Body, BufferId, ExternCall, LoopBuffer, LoopKind, LoopNode, LoopProgram, ScalarOp, StridedOperand,
};
use coil_ir::sym::Expr;
use coil_ir::{BinaryOp, DType, Op, TensorMeta};

pub(crate) fn buffer(name: &str, shape: &[usize], dtype: DType) -> LoopBuffer {
    LoopBuffer::new(name, TensorMeta::new(shape.to_vec(), dtype))
}

/// A buffer whose sizes may name size symbols; its meta at `hints` (the program's hints).
pub(crate) fn buffer_e(name: &str, shape: &[Expr], dtype: DType, hints: &Bindings) -> LoopBuffer {
    let sizes: Vec<usize> = shape.iter().map(|e| e.eval(hints).expect("every symbol has a hint") as usize).collect();
    LoopBuffer { name: name.into(), meta: TensorMeta::new(sizes, dtype), shape: shape.to_vec() }
}

/// A pointwise node `out = a OP b` over `n` elements (the body is for show: the C is by hand).
pub(crate) fn pointwise(out: usize, n: usize, loads: &[usize], op: BinaryOp, dtype: DType) -> LoopNode {
    let mut body = Body::default();
    let x = Expr::index("x0", n as i64);
    let vals: Vec<_> =
        loads.iter().map(|&b| body.push(ScalarOp::Load { buffer: BufferId(b), index: x }, dtype)).collect();
    body.result = if vals.len() == 2 { body.push(ScalarOp::Binary(op, vals[0], vals[1]), dtype) } else { vals[0] };
    LoopNode {
        output: BufferId(out),
        origins: vec![op.name()],
        kind: LoopKind::Pointwise { ranges: vec![Expr::int(n as i64)], body, scatter: None },
    }
}

pub(crate) fn fused(name: &str, kind: KernelKind, node: usize, n: usize, stores: &[usize]) -> FusedKernel {
    FusedKernel {
        name: name.into(),
        kind,
        nodes: vec![node],
        xnumel: Expr::int(n as i64),
        rnumel: None,
        stores: stores.iter().map(|&b| BufferId(b)).collect(),
    }
}

/// A tile kernel with arguments `(name, buffer, dtype, written)`; only the signature matters.
pub(crate) fn tile(name: &str, n: usize, args: &[(&str, usize, DType, bool)]) -> TileKernel {
    TileKernel {
        name: name.into(),
        kind: KernelKind::Pointwise,
        args: args
            .iter()
            .map(|&(a, b, dtype, w)| TileArg { name: a.into(), buffer: BufferId(b), dtype, read: !w, written: w })
            .collect(),
        xnumel: Expr::int(n as i64),
        rnumel: None,
        sizes: vec![],
        random: vec![],
        xblock: 1024,
        rblock: 1,
        body: vec![],
    }
}

/// An all-extern program: `buf2 = arg0^T @ arg1` per batch (`arg0: f32[2, k, m]` read
/// transposed, `arg1: f32[k, n]` broadcast over the batch), then a fallback cumsum of it along
/// the last dim into `buf3`, the output; no kernel to compile.
pub(crate) fn extern_only(m: usize, n: usize, k: usize) -> (LoopProgram, Schedule) {
    let f = DType::F32;
    let e = |v: usize| Expr::from(v);
    let a = StridedOperand {
        buffer: BufferId(0),
        offset: e(0),
        batch_strides: vec![e(k * m)],
        row_stride: e(1),
        col_stride: e(m),
    };
    let b = StridedOperand {
        buffer: BufferId(1),
        offset: e(0),
        batch_strides: vec![e(0)],
        row_stride: e(n),
        col_stride: e(1),
    };
    let call = ExternCall::Bmm {
        a,
        b,
        bias: None,
        activation: None,
        activation_grad: None,
        saved: None,
        batch: vec![e(2)],
        m: e(m),
        n: e(n),
        k: e(k),
    };
    let bmm = LoopNode {
        output: BufferId(2),
        origins: vec!["bmm"],
        kind: LoopKind::Extern { call, inputs: vec![BufferId(0), BufferId(1)] },
    };
    let cumsum = LoopNode {
        output: BufferId(3),
        origins: vec!["cumsum"],
        kind: LoopKind::Extern { call: ExternCall::Fallback { op: Op::Cumsum { dim: 2 } }, inputs: vec![BufferId(2)] },
    };
    let program = LoopProgram {
        symbols: vec![],
        data_checks: vec![],
        buffers: vec![
            buffer("arg0", &[2, k, m], f),
            buffer("arg1", &[k, n], f),
            buffer("buf2", &[2, m, n], f),
            buffer("buf3", &[2, m, n], f),
        ],
        inputs: vec![BufferId(0), BufferId(1)],
        outputs: vec![BufferId(3)],
        nodes: vec![bmm, cumsum],
    };
    let schedule = Schedule {
        kernels: vec![
            fused("ext_bmm_0", KernelKind::Extern, 0, 2 * m * n, &[2]),
            fused("ext_cumsum_1", KernelKind::Extern, 1, 2 * m * n, &[3]),
        ],
        ..Default::default()
    };
    (program, schedule)
}
