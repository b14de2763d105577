//! `coil-nn`: the model library above the compiler, as `torch.nn` and `torch.optim` are above
//! PyTorch's tensors (and `candle-nn` above candle's).
//!
//! It owns:
//! * named parameters ([`param`]): [`Param`], the [`ParamStore`] that holds a model's parameters
//!   by full name, the [`Path`] a module is built from, initializations ([`Init`]), training
//!   mode and the mixed-precision policy ([`Mode`], [`Precision`]);
//! * modules ([`modules`]): [`Linear`], [`Embedding`], [`LayerNorm`], [`RmsNorm`], [`Dropout`],
//!   [`Conv1d`], [`Conv2d`], [`BatchNorm2d`] (running statistics updated in place),
//!   causal self-attention (GPT-2 and Llama layouts), the GELU and gated (SwiGLU) MLPs, rotary
//!   embeddings, all behind the [`Module`] trait;
//! * optimizers ([`optim`]): [`Sgd`], [`AdamW`], [`clip_grad_norm`], learning-rate schedules;
//!   a step updates parameters and state in place, in one compiled graph;
//! * models ([`models`]): GPT-2 and Llama with Hugging Face's parameter names, ResNet-50 with
//!   torchvision's;
//! * saving and loading ([`io`]): parameters and optimizer state as safetensors files, by name,
//!   checked before anything is bound;
//! * tokenizers ([`tokenizer`]): Hugging Face's byte-level BPE files (GPT-2, Llama 3).
//!
//! Why a store and paths, not a derive macro: a module is a plain struct of its parts, built
//! from the [`Path`] of its parameters (candle's `VarBuilder` pattern). The names are fixed
//! when the model is built, so they can be Hugging Face's without a mapping table; the store
//! lists, loads, saves and optimizes parameters by name without walking the module tree, and
//! no procedural macro crate sits between the user and the compiler's errors. burn's
//! `#[derive(Module)]` gives the same listing from the struct's fields, at the price of field
//! names that must match the checkpoint's and a macro to debug through.
//!
//! ```
//! use coil_nn::{Linear, Module, ParamStore};
//! use coil_frontend::Tensor;
//! use coil_ir::DType;
//! let store = ParamStore::new();
//! let root = store.root(coil_runtime::Device::Cpu, DType::F32);
//! let (fc1, fc2) = (Linear::new(&root.pp("fc1"), 4, 8, true)?, Linear::new(&root.pp("fc2"), 8, 2, true)?);
//! let x = Tensor::randn(&[3, 4], DType::F32)?;
//! let y = fc2.forward(&fc1.forward(&x)?.relu()?)?;
//! assert_eq!(y.shape(), &[3, 2]);
//! assert_eq!(store.num_elements(), 4 * 8 + 8 + 8 * 2 + 2);
//! # Ok::<(), coil_ir::Error>(())
//! ```

#![warn(missing_docs)]

pub mod io;
pub mod models;
pub mod modules;
pub mod optim;
pub mod param;
pub mod tokenizer;

pub use io::{load_optimizer, save_optimizer, LoadOptions};
pub use modules::conv::{Conv1d, Conv2d};
pub use modules::layers::{Dropout, Embedding, LayerNorm, Layout, Linear, RmsNorm};
pub use modules::norm::{BatchNorm2d, BatchNormConfig, RunningStats};
pub use modules::transformer::{CausalSelfAttention, GatedMlp, KvCache, Mlp, Rotary};
pub use optim::{clip_grad_norm, AdamW, AdamWConfig, Constant, LrSchedule, Optimizer, Sgd, SgdConfig, WarmupCosine};
pub use param::{Init, Mode, Param, ParamStore, Path, Precision};
pub use tokenizer::Tokenizer;

use coil_frontend::Tensor;
use coil_ir::Result;

/// `loss` recomputed with its gradient with respect to each of `params` (their current values),
/// in order: `coil::value_and_grad` over a model's parameters.
#[track_caller]
pub fn value_and_grad(loss: &Tensor, params: &[Param]) -> Result<(Tensor, Vec<Tensor>)> {
    let values: Vec<Tensor> = params.iter().map(Param::tensor).collect();
    coil_frontend::value_and_grad(loss, &values.iter().collect::<Vec<_>>())
}

/// A layer or model: a function of one tensor with parameters.
pub trait Module {
    /// The layer applied to `x` (lazily: records the ops, computes nothing yet).
    fn forward(&self, x: &Tensor) -> Result<Tensor>;
}
