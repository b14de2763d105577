//! Test support: captured graphs built by hand, shared by the decomposition tests and the
//! attention matcher's tests.

use coil_ir::{DType, Graph, NodeId, Op, Scalar, TensorMeta};
use std::panic::Location;

/// The line every captured node these tests build is recorded at.
pub(crate) fn here() -> &'static Location<'static> {
    Location::caller()
}

pub(crate) fn m(shape: &[usize], dtype: DType) -> TensorMeta {
    TensorMeta::new(shape.to_vec(), dtype)
}

/// A captured graph under construction.
pub(crate) struct Capture {
    pub(crate) g: Graph,
}

impl Capture {
    pub(crate) fn new() -> Capture {
        Capture { g: Graph::new() }
    }
    pub(crate) fn input(&mut self, shape: &[usize], dtype: DType) -> NodeId {
        self.g.input(m(shape, dtype))
    }
    pub(crate) fn scalar(&mut self, s: impl Into<Scalar>) -> NodeId {
        let s = s.into();
        self.g.leaf(Op::Scalar(s), m(&[], s.dtype()), Some(here()))
    }
    pub(crate) fn full(&mut self, v: impl Into<Scalar>, shape: &[usize], dtype: DType) -> NodeId {
        self.g.full(v.into(), shape.to_vec(), dtype, Some(here()))
    }
    pub(crate) fn op(&mut self, op: Op, inputs: &[NodeId]) -> NodeId {
        self.g.push(op, inputs, Some(here())).unwrap_or_else(|e| panic!("{e}\n{}", self.g))
    }
    pub(crate) fn permute(&mut self, x: NodeId, perm: &[usize]) -> NodeId {
        self.op(Op::Permute { perm: perm.to_vec() }, &[x])
    }
    pub(crate) fn out(mut self, outputs: &[NodeId]) -> Graph {
        self.g.outputs.extend_from_slice(outputs);
        self.g
    }
}
