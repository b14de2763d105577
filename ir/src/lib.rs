//! `coil-ir`: the data structures every other coil crate speaks.
//!
//! It owns:
//! * [`DType`] and PyTorch's type-promotion rules ([`dtype`]);
//! * [`sym`], the symbolic integer algebra for shapes and index expressions;
//! * the op set ([`Op`]): primitives and the composite ops users call;
//! * shape and dtype inference for every op ([`infer`]);
//! * the tensor [`Graph`] (an FX-like arena of nodes with shapes, dtypes and source lines) and
//!   its deterministic printer;
//! * the loop-level IR ([`loops`]) that graphs are lowered to before fusion, and the kernel
//!   level ([`kernel`]): the scheduler's fused kernels and the Triton-style block IR;
//! * the parsers of the three IR texts ([`parse`]: [`Graph::parse`],
//!   [`loops::LoopProgram::parse`], [`kernel::TileKernel::parse`]);
//! * coil's [`Error`] type;
//! * the typed [`config`]uration every crate reads its settings from;
//! * the formulas of [`special`] functions every backend shares (`erfinv`);
//! * the description of a GPU that code is generated for ([`target::GpuTarget`]).
//!
//! It depends on nothing else in coil.

#![warn(missing_docs)]

pub mod config;
pub mod dtype;
pub mod dynamic;
pub mod error;
pub mod graph;
pub mod infer;
pub mod kernel;
pub mod loops;
pub mod op;
pub mod parse;
pub mod philox;
pub mod special;
pub mod sym;
pub mod target;
#[doc(hidden)]
pub mod testing;

pub use dtype::{DType, Scalar};
pub use error::{Error, ErrorKind, Result};
pub use graph::{Graph, Node, NodeId, Shape, TensorMeta};
pub use op::{AttentionDropout, AttentionInput, BinaryOp, LossReduction, Op, RandDist, ReduceOp, UnaryOp};
pub use philox::RandomState;
