//! `coil-frontend`: the user-facing lazy tensor API.
//!
//! It owns:
//! * [`Tensor`]: a lazy tensor whose ops record nodes with the caller's source line;
//! * the op methods (`ops`), with PyTorch's names, semantics and errors;
//! * gradients ([`grad`], [`value_and_grad`]): reverse mode on the decomposed graph, as more
//!   lazy tensors;
//! * [`capture`] (tensors to a [`coil_ir::Graph`]) and realization: capture, then either the
//!   compile driver ([`compile`]: decompose, lower, fuse, generate C, build, run) or the
//!   reference interpreter ([`Backend`]); on the CPU a graph not compiled yet runs on tier 0
//!   while it compiles in the background ([`tiered`]);
//! * the disk cache of whole compiled graphs ([`graph_cache`]);
//! * debug dumps (`COIL_DEBUG`, [`debug`]) and logs (`COIL_LOGS`, [`logs`]);
//! * compiled functions ([`dynamo`]): guarded caches, graph breaks, recompiles, `explain`;
//! * weights in safetensors files ([`safetensors`]): memory-mapped loading, checking, saving.

#![warn(missing_docs)]

pub mod alias;
pub mod autodiff;
pub mod compile;
pub mod debug;
pub mod dynamo;
mod generalize;
pub mod graph_cache;
mod guard;
pub mod history;
pub mod inplace;
pub mod logs;
pub mod ops;
pub mod profile;
pub mod realize;
pub mod safetensors;
pub mod storage;
pub mod tensor;
pub mod tiered;
mod walk;

pub use autodiff::{grad, value_and_grad};
pub use dynamo::{explain, set_stance, CompiledFn, ExplainReport, GraphBreak, Stance};
pub use inplace::{is_compiling, update_in_place, update_in_place_with};
pub use ops::linalg::linear;
pub use ops::movement::{cat, stack};
pub use ops::nn::{
    embedding, scaled_dot_product_attention, scaled_dot_product_attention_dropout, CrossEntropyOptions, LossReduction,
};
pub use ops::pointwise::{pow, where_, IntoTensor};
pub use realize::{
    backend, capture, realize, set_backend, set_cuda_graphs, set_eager_tier, synchronize, Backend, Captured,
};
pub use storage::Storage;
pub use tensor::{default_device, manual_seed, set_default_device, wrap_dim, Tensor};
