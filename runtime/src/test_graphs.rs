//! Small loop programs, schedules and tile-kernel signatures for the backends' tests (the CPU
//! and CUDA tests build the same graphs around hand-written kernels).

use coil_ir::kernel::{FusedKernel, KernelKind, TileArg, TileKernel};
use coil_ir::loops::{Bindings, Body, BufferId, LoopBuffer, LoopKind, LoopNode, ScalarOp};
use coil_ir::sym::Expr;
use coil_ir::{BinaryOp, DType, TensorMeta};

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
        kind: LoopKind::Pointwise { ranges: vec![Expr::int(n as i64)], body },
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
        xblock: 1024,
        rblock: 1,
        body: vec![],
    }
}
