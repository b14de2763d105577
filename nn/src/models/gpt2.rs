//! GPT-2 (Radford et al. 2019) as nanoGPT and Hugging Face's `GPT2LMHeadModel` write it: learned
//! token and position embeddings, pre-norm blocks of causal self-attention and a GELU MLP, a
//! final layer norm, and the output projection tied to the token embedding. Parameter names and
//! layouts are Hugging Face's (`h.0.attn.c_attn.weight`, Conv1D weights `[in, out]`), so a
//! `model.safetensors` from the Hub loads by name.

use crate::modules::layers::{Dropout, Embedding, LayerNorm};
use crate::modules::transformer::{CausalSelfAttention, KvCache, Mlp};
use crate::param::{Init, Mode, Path};
use crate::Module;
use coil_frontend::safetensors::WeightFile;
use coil_frontend::{CrossEntropyOptions, Tensor};
use coil_ir::{DType, Error, Result};
use std::collections::BTreeMap;

/// GPT-2's sizes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Gpt2Config {
    /// Tokens in the vocabulary (rows of `wte`).
    pub vocab_size: usize,
    /// The longest sequence (`n_positions`).
    pub block_size: usize,
    /// Transformer blocks.
    pub n_layer: usize,
    /// Attention heads per block.
    pub n_head: usize,
    /// The embedding width (`C`); a multiple of `n_head`.
    pub n_embd: usize,
    /// Dropout probability after the embeddings, on the attention probabilities and after each
    /// residual branch (in training mode).
    pub dropout: f64,
    /// The epsilon of every layer norm.
    pub layer_norm_eps: f64,
}

impl Gpt2Config {
    /// The sizes as safetensors metadata (`gpt2.n_layer` = `12`, ...), for checkpoints.
    pub fn metadata(&self) -> Vec<(String, String)> {
        let mut m: Vec<(String, String)> = [
            ("vocab_size", self.vocab_size),
            ("block_size", self.block_size),
            ("n_layer", self.n_layer),
            ("n_head", self.n_head),
            ("n_embd", self.n_embd),
        ]
        .iter()
        .map(|(k, v)| (format!("gpt2.{k}"), v.to_string()))
        .collect();
        m.push(("gpt2.dropout".into(), self.dropout.to_string()));
        m.push(("gpt2.layer_norm_eps".into(), self.layer_norm_eps.to_string()));
        m
    }

    /// The sizes saved by [`Gpt2Config::metadata`].
    pub fn from_metadata(metadata: &BTreeMap<String, String>) -> Result<Gpt2Config> {
        let get = |k: &str| -> Result<f64> {
            let v = metadata.get(&format!("gpt2.{k}"));
            v.and_then(|v| v.parse().ok())
                .ok_or_else(|| Error::value(format!("no gpt2.{k} in the checkpoint's metadata")))
        };
        Ok(Gpt2Config {
            vocab_size: get("vocab_size")? as usize,
            block_size: get("block_size")? as usize,
            n_layer: get("n_layer")? as usize,
            n_head: get("n_head")? as usize,
            n_embd: get("n_embd")? as usize,
            dropout: get("dropout")?,
            layer_norm_eps: get("layer_norm_eps")?,
        })
    }

    /// The sizes of the GPT-2 in a Hugging Face checkpoint, read from its tensors' shapes
    /// (every GPT-2 has heads of 64 features).
    pub fn from_hf(file: &WeightFile) -> Result<Gpt2Config> {
        let shape = |n: &str| {
            let info = file.info(n).or_else(|| file.info(&format!("transformer.{n}")));
            info.map(|i| i.shape.clone()).ok_or_else(|| Error::value(format!("{}: no {n}", file.path().display())))
        };
        let (wte, wpe) = (shape("wte.weight")?, shape("wpe.weight")?);
        let n_layer = (0..).take_while(|i| shape(&format!("h.{i}.ln_1.weight")).is_ok()).count();
        let n_embd = wte[1];
        Ok(Gpt2Config {
            vocab_size: wte[0],
            block_size: wpe[0],
            n_layer,
            n_head: n_embd / 64,
            n_embd,
            dropout: 0.0,
            layer_norm_eps: 1e-5,
        })
    }

    /// The store's name for a tensor of a Hugging Face GPT-2 checkpoint: without the
    /// `transformer.` prefix that `GPT2LMHeadModel` saves; `None` for the attention-mask
    /// buffers and the output projection (tied to `wte`).
    ///
    /// ```
    /// use coil_nn::models::gpt2::Gpt2Config;
    /// assert_eq!(Gpt2Config::hf_name("transformer.h.0.attn.c_attn.weight").as_deref(), Some("h.0.attn.c_attn.weight"));
    /// assert_eq!(Gpt2Config::hf_name("h.3.attn.bias"), None);
    /// assert_eq!(Gpt2Config::hf_name("lm_head.weight"), None);
    /// ```
    pub fn hf_name(name: &str) -> Option<String> {
        let name = name.strip_prefix("transformer.").unwrap_or(name);
        let buffer = name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias");
        (!buffer && name != "lm_head.weight").then(|| name.to_string())
    }

    /// A tiny GPT-2 (2 layers of 64 features, 2 heads, 256 byte tokens, 128 positions): for
    /// tests and examples that run anywhere in milliseconds.
    pub fn tiny() -> Gpt2Config {
        Gpt2Config {
            vocab_size: 256,
            block_size: 128,
            n_layer: 2,
            n_head: 2,
            n_embd: 64,
            dropout: 0.0,
            layer_norm_eps: 1e-5,
        }
    }

    /// GPT-2 small (124M parameters) with the vocabulary padded to 50304 (a multiple of 64, as
    /// nanoGPT trains it); the Hub's checkpoint has 50257.
    pub fn gpt2_124m() -> Gpt2Config {
        Gpt2Config {
            vocab_size: 50304,
            block_size: 1024,
            n_layer: 12,
            n_head: 12,
            n_embd: 768,
            dropout: 0.0,
            layer_norm_eps: 1e-5,
        }
    }
}

/// One transformer block: `x + attn(ln_1(x))`, then `x + mlp(ln_2(x))`.
#[derive(Clone, Debug)]
pub struct Block {
    /// The norm before attention.
    pub ln_1: LayerNorm,
    /// Causal self-attention.
    pub attn: CausalSelfAttention,
    /// The norm before the MLP.
    pub ln_2: LayerNorm,
    /// The MLP.
    pub mlp: Mlp,
}

impl Module for Block {
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x = x.add(&self.attn.forward(&self.ln_1.forward(x)?)?)?;
        x.add(&self.mlp.forward(&self.ln_2.forward(&x)?)?)
    }
}

/// GPT-2 with its language-model head.
///
/// ```
/// use coil_nn::models::gpt2::{Gpt2, Gpt2Config};
/// use coil_nn::ParamStore;
/// use coil_frontend::Tensor;
/// use coil_ir::DType;
/// let cfg = Gpt2Config { vocab_size: 11, block_size: 8, n_layer: 1, n_head: 2, n_embd: 8, dropout: 0.0, layer_norm_eps: 1e-5 };
/// let store = ParamStore::new();
/// let model = Gpt2::new(&store.root(coil_runtime::Device::Cpu, DType::F32), cfg)?;
/// assert!(store.names().contains(&"h.0.attn.c_attn.weight".to_string()));
/// let idx = Tensor::from_vec(vec![1i64, 2, 3, 4], &[1, 4])?;
/// assert_eq!(model.forward(&idx)?.shape(), &[1, 4, 11]);
/// # Ok::<(), coil_ir::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Gpt2 {
    /// The sizes it was built with.
    pub config: Gpt2Config,
    /// Token embeddings `[vocab_size, n_embd]`, also the language-model head (tied).
    pub wte: Embedding,
    /// Position embeddings `[block_size, n_embd]`.
    pub wpe: Embedding,
    /// The transformer blocks (`h.0`, `h.1`, ...).
    pub h: Vec<Block>,
    /// The final layer norm.
    pub ln_f: LayerNorm,
    drop: Dropout,
    mode: Mode,
}

impl Gpt2 {
    /// A GPT-2 with nanoGPT's initialization: `N(0, 0.02)` for embeddings and projections,
    /// `N(0, 0.02 / sqrt(2 n_layer))` for the projections into the residual stream, zero biases.
    #[track_caller]
    pub fn new(path: &Path, config: Gpt2Config) -> Result<Gpt2> {
        let c = config.n_embd;
        let normal = Init::Normal { mean: 0.0, std: 0.02 };
        let proj_std = 0.02 / ((2 * config.n_layer.max(1)) as f64).sqrt();
        let wte = Embedding::with_init(&path.pp("wte"), config.vocab_size, c, normal)?;
        let wpe = Embedding::with_init(&path.pp("wpe"), config.block_size, c, normal)?;
        let mut h = Vec::with_capacity(config.n_layer);
        for i in 0..config.n_layer {
            let p = path.pp("h").pp(i);
            h.push(Block {
                ln_1: LayerNorm::new(&p.pp("ln_1"), c, config.layer_norm_eps)?,
                attn: CausalSelfAttention::gpt2(&p.pp("attn"), c, config.n_head, config.dropout, proj_std)?,
                ln_2: LayerNorm::new(&p.pp("ln_2"), c, config.layer_norm_eps)?,
                mlp: Mlp::gpt2(&p.pp("mlp"), c, config.dropout, proj_std)?,
            });
        }
        let ln_f = LayerNorm::new(&path.pp("ln_f"), c, config.layer_norm_eps)?;
        Ok(Gpt2 { config, wte, wpe, h, ln_f, drop: Dropout::new(path, config.dropout), mode: path.mode() })
    }

    /// The final hidden states `[B, T, C]` of token ids `idx` `[B, T]` (i64).
    #[track_caller]
    pub fn hidden(&self, idx: &Tensor) -> Result<Tensor> {
        let &[_, t] = idx.shape() else {
            return Err(
                Error::shape(format!("GPT-2 expects token ids [B, T], got {}", idx.meta())).in_op("Gpt2", vec![])
            );
        };
        if t > self.config.block_size {
            return Err(Error::shape(format!("{t} tokens exceed the block size {}", self.config.block_size))
                .in_op("Gpt2", vec![idx.meta().to_string()]));
        }
        let pos = Tensor::arange(0, t as i64, 1, DType::I64)?.to_device(idx.device())?;
        let mut x = self.drop.forward(&self.wte.forward(idx)?.add(&self.wpe.forward(&pos)?)?)?;
        for block in &self.h {
            x = block.forward(&x)?;
        }
        self.ln_f.forward(&x)
    }

    /// The logits `[B, T, vocab]` (the output projection shares `wte`'s weight).
    #[track_caller]
    pub fn forward(&self, idx: &Tensor) -> Result<Tensor> {
        let x = self.hidden(idx)?;
        let dtype = self.mode.compute_dtype(x.dtype());
        coil_frontend::linear(&x.to_dtype(dtype)?, &self.wte.weight.tensor().to_dtype(dtype)?, None)
    }

    /// One step of incremental decoding (or a prefill): token ids `idx` (`[B, T]`) at positions
    /// `pos..pos + T` (`pos` a 0-d i64 tensor, [`KvCache::position`]), attending to `cache`'s
    /// earlier positions. Returns the logits of the last position (`[B, vocab]`, f32) and each
    /// layer's keys and values with this step's written (for [`KvCache::commit`]). Every
    /// decode step is the same graph: it compiles once.
    #[track_caller]
    pub fn forward_cached(
        &self,
        idx: &Tensor,
        pos: &Tensor,
        cache: &KvCache,
    ) -> Result<(Tensor, Vec<(Tensor, Tensor)>)> {
        let &[_, t] = idx.shape() else {
            return Err(
                Error::shape(format!("GPT-2 expects token ids [B, T], got {}", idx.meta())).in_op("Gpt2", vec![])
            );
        };
        if t == 0 || cache.len() + t > cache.capacity().min(self.config.block_size) {
            return Err(Error::shape(format!(
                "{t} more tokens after {} do not fit the cache ({}) or the block size ({})",
                cache.len(),
                cache.capacity(),
                self.config.block_size
            ))
            .in_op("Gpt2::forward_cached", vec![idx.meta().to_string()]));
        }
        let positions = Tensor::arange(0, t as i64, 1, DType::I64)?.to_device(idx.device())?.add(pos)?;
        let mut x = self.drop.forward(&self.wte.forward(idx)?.add(&self.wpe.forward(&positions)?)?)?;
        let mut written = Vec::with_capacity(self.h.len());
        for (layer, block) in self.h.iter().enumerate() {
            let (y, k, v) =
                block.attn.forward_cached(&block.ln_1.forward(&x)?, pos, &cache.k[layer], &cache.v[layer])?;
            x = x.add(&y)?;
            x = x.add(&block.mlp.forward(&block.ln_2.forward(&x)?)?)?;
            written.push((k, v));
        }
        let last = self.ln_f.forward(&x.select(1, t as i64 - 1)?)?;
        let dtype = self.mode.compute_dtype(last.dtype());
        let logits = coil_frontend::linear(&last.to_dtype(dtype)?, &self.wte.weight.tensor().to_dtype(dtype)?, None)?;
        Ok((logits.to_dtype(DType::F32)?, written))
    }

    /// An empty key/value cache for `batch` sequences of up to `capacity` tokens, in the dtype
    /// attention computes in.
    #[track_caller]
    pub fn new_cache(&self, batch: usize, capacity: usize) -> Result<KvCache> {
        let (heads, d) = self.h.first().map_or((self.config.n_head, 0), |b| b.attn.kv_shape());
        let dtype = self.mode.compute_dtype(self.wte.weight.dtype());
        KvCache::new(self.h.len(), batch, heads, capacity, d, dtype, self.wte.weight.device())
    }

    /// The mean cross-entropy of the next-token predictions against `targets` `[B, T]`,
    /// computed in f32.
    #[track_caller]
    pub fn loss(&self, idx: &Tensor, targets: &Tensor) -> Result<Tensor> {
        let logits = self.forward(idx)?;
        let v = self.config.vocab_size as i64;
        let logits = logits.reshape(&[-1, v])?.to_dtype(DType::F32)?;
        logits.cross_entropy(&targets.reshape(&[-1])?, CrossEntropyOptions::default())
    }
}
