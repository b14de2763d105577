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
//! A function of tensors compiled with [`compile`] captures its graphs on each call, serves
//! them from a guarded cache (dtypes, devices, static sizes, graph structure), recompiles when
//! a guard fails and says which, and cuts its graph at host reads (graph breaks); [`explain()`]
//! reports graphs, breaks with their reasons and lines, ops and guards:
//!
//! ```
//! use coil::{DType, Tensor};
//! let f = coil::compile(|a: &[Tensor]| Ok(vec![a[0].softmax(-1)?]));
//! let x = Tensor::ones(&[2, 4], DType::F32);
//! assert_eq!(f.call(&[&x])?[0].to_vec::<f32>()?, vec![0.25; 8]);
//! f.call(&[&x])?;
//! assert_eq!(f.compile_count(), 1);
//! let report = coil::explain(|| Ok(vec![x.exp()?]))?;
//! assert_eq!((report.graph_count, report.graph_break_count), (1, 0));
//! # Ok::<(), coil::Error>(())
//! ```
//!
//! The crates behind this facade, from the bottom up: `coil-ir` (dtypes, symbolic integers,
//! the op set, the graph), `coil-passes` (decomposition), `coil-codegen`, `coil-runtime`
//! (buffers, devices, the reference interpreter), `coil-frontend` (the `Tensor` API).

#![warn(missing_docs)]

pub use coil_frontend::compile::{compile_count, inspect, Compiled, Executable, StageTimes};
pub use coil_frontend::dynamo::{
    compile, explain, set_stance, stance, BreakKind, CallStats, CompiledFn, ExplainReport, GraphBreak, GraphInfo,
    Guard, Source, Stance, DEFAULT_REPLAY_CHECK, RECOMPILE_LIMIT,
};
pub use coil_frontend::ops::assemble::{block_diag, broadcast_tensors, cartesian_prod};
pub use coil_frontend::ops::conv::ConvOptions;
pub use coil_frontend::ops::data_dependent::Unique;
pub use coil_frontend::ops::einsum::einsum;
pub use coil_frontend::ops::indexing::*;
pub use coil_frontend::ops::linalg::*;
pub use coil_frontend::ops::loss::{KlDivReduction, NllLossOptions};
pub use coil_frontend::ops::movement::*;
pub use coil_frontend::ops::nn::*;
pub use coil_frontend::ops::products::multi_dot;
pub use coil_frontend::ops::registry as op_registry;
pub use coil_frontend::ops::sampling::Sampling;
pub use coil_frontend::ops::scatter::ScatterReduce;
pub use coil_frontend::ops::vision::{GridSample, Interpolation};
pub use coil_frontend::{
    backend, capture, default_device, grad, manual_seed, pow, realize, set_backend, set_cuda_graphs,
    set_default_device, set_eager_tier, synchronize, update_in_place, update_in_place_with, value_and_grad, where_,
    Backend, Captured, IntoTensor, Storage, Tensor,
};
pub use coil_frontend::{history, profile, safetensors, tiered};
/// The configuration ([`Config`]): [`set_config`] replaces it, [`with_config`] sets it for a
/// closure on this thread, `config()` reads the one in force; the environment (`COIL_LOGS`,
/// `COIL_DEBUG`, `COIL_CACHE_DIR`, ...) only supplies its defaults ([`Config::from_env`]).
pub use coil_ir::config::{current as config, set_config, with_config, Config, CudnnApi};
pub use coil_ir::{DType, Error, ErrorKind, Graph, LossReduction, RandomState, Result, Scalar, TensorMeta};
pub use coil_passes::decompose;
pub use coil_runtime::cuda::cuda_available;
pub use coil_runtime::{Buffer, Device, Element, HostData};

/// Modules, named parameters, optimizers and models (`torch.nn`, `torch.optim`).
pub use coil_nn as nn;

/// The IR, for programs that inspect graphs.
pub use coil_ir as ir;
