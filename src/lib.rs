//! # coil
//!
//! A graph-capture tensor compiler for Rust programs, in the style of PyTorch's TorchInductor.
//!
//! Tensors are lazy: every op records a node (with the caller's `file:line`); asking for a value
//! (`to_vec`, `item`, `realize`, `Display`) turns the pending nodes into one graph, decomposes it
//! into a small closed set of primitives and runs it.
//!
//! ```
//! use coil::{DType, Tensor};
//! let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
//! let w = Tensor::ones(&[2, 2], DType::F32);
//! let y = (x.matmul(&w)? + 1.0).softmax(-1)?;
//!
//! // Nothing has run yet. The captured graph, and the primitive graph it decomposes to:
//! let captured = coil::capture(&[&y]).graph;
//! assert!(captured.to_string().contains("softmax"));
//! let primitive = coil::decompose(&captured)?;
//! assert!(primitive.to_string().contains("amax"));
//!
//! // Asking for values runs the graph.
//! assert_eq!(y.to_vec::<f32>()?, vec![0.5; 4]);
//! # Ok::<(), coil::Error>(())
//! ```
//!
//! The crates behind this facade, from the bottom up: `coil-ir` (dtypes, symbolic integers,
//! the op set, the graph), `coil-passes` (decomposition), `coil-codegen`, `coil-runtime`
//! (buffers, devices, the reference interpreter), `coil-frontend` (the `Tensor` API).

pub use coil_frontend::compile::{inspect, Compiled, Executable, StageTimes};
pub use coil_frontend::ops::linalg::*;
pub use coil_frontend::ops::movement::*;
pub use coil_frontend::ops::nn::*;
pub use coil_frontend::{
    backend, capture, default_device, manual_seed, pow, realize, set_backend, set_default_device, where_, Backend,
    Captured, IntoTensor, Storage, Tensor,
};
pub use coil_ir::{DType, Error, ErrorKind, Graph, LossReduction, Result, Scalar, TensorMeta};
pub use coil_passes::decompose;
pub use coil_runtime::cuda::cuda_available;
pub use coil_runtime::{Buffer, Device, Element, HostData};

/// The IR, for programs that inspect graphs.
pub use coil_ir as ir;
