//! Whole models written with the modules of this crate, with their reference implementations'
//! parameter names: GPT-2 and Llama as Hugging Face's, ResNet as torchvision's.

pub mod gpt2;
pub mod llama;
pub mod resnet;

use crate::KvCache;
use coil_frontend::Tensor;
use coil_ir::Result;

/// A language model that decodes with a key/value cache ([`gpt2::Gpt2`], [`llama::Llama`]):
/// what a generation loop needs, whatever the architecture.
///
/// ```
/// use coil_nn::models::{gpt2::{Gpt2, Gpt2Config}, CausalLm};
/// use coil_nn::ParamStore;
/// use coil_frontend::Tensor;
/// # fn main() -> coil_ir::Result<()> {
/// let config = Gpt2Config { vocab_size: 11, block_size: 8, n_layer: 1, n_head: 2, n_embd: 8, dropout: 0.0, layer_norm_eps: 1e-5 };
/// let store = ParamStore::new();
/// let model: Box<dyn CausalLm> = Box::new(Gpt2::new(&store.root(coil_runtime::Device::Cpu, coil_ir::DType::F32), config)?);
/// let mut cache = model.new_cache(1, model.max_positions())?;
/// let prompt = Tensor::from_vec(vec![1i64, 2, 3], &[1, 3])?;
/// let (logits, written) = model.forward_cached(&prompt, &cache.position()?, &cache)?;
/// cache.commit(&written, 3, &[&logits])?;
/// assert_eq!((logits.shape(), cache.len()), (&[1, 11][..], 3));
/// # Ok(()) }
/// ```
pub trait CausalLm {
    /// One step of incremental decoding (or a prefill) of token ids `[B, T]` at position `pos`
    /// (a 0-d i64 tensor): the last position's logits (`[B, vocab]`, f32) and each layer's
    /// cache with this step written ([`KvCache::commit`] writes them over the cache).
    fn forward_cached(&self, idx: &Tensor, pos: &Tensor, cache: &KvCache) -> Result<(Tensor, Vec<(Tensor, Tensor)>)>;
    /// An empty cache for `batch` sequences of up to `capacity` tokens.
    fn new_cache(&self, batch: usize, capacity: usize) -> Result<KvCache>;
    /// The number of token ids.
    fn vocab_size(&self) -> usize;
    /// The longest sequence the model's positions cover.
    fn max_positions(&self) -> usize;
}

impl CausalLm for gpt2::Gpt2 {
    fn forward_cached(&self, idx: &Tensor, pos: &Tensor, cache: &KvCache) -> Result<(Tensor, Vec<(Tensor, Tensor)>)> {
        gpt2::Gpt2::forward_cached(self, idx, pos, cache)
    }
    fn new_cache(&self, batch: usize, capacity: usize) -> Result<KvCache> {
        gpt2::Gpt2::new_cache(self, batch, capacity)
    }
    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }
    fn max_positions(&self) -> usize {
        self.config.block_size
    }
}

impl CausalLm for llama::Llama {
    fn forward_cached(&self, idx: &Tensor, pos: &Tensor, cache: &KvCache) -> Result<(Tensor, Vec<(Tensor, Tensor)>)> {
        llama::Llama::forward_cached(self, idx, pos, cache)
    }
    fn new_cache(&self, batch: usize, capacity: usize) -> Result<KvCache> {
        llama::Llama::new_cache(self, batch, capacity)
    }
    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }
    fn max_positions(&self) -> usize {
        self.config.max_positions
    }
}
