//! Llama (Touvron et al. 2023) as Hugging Face's `LlamaForCausalLM` writes it: token embeddings,
//! pre-norm blocks of RMSNorm, grouped-query attention with rotary embeddings and a SwiGLU MLP,
//! a final RMSNorm and the output projection (tied to the embeddings or not). Parameter names are
//! Hugging Face's (`model.layers.0.self_attn.q_proj.weight`), so its `model.safetensors` loads by
//! name, and its `config.json` gives the sizes.

use crate::modules::layers::{Embedding, Layout, Linear, RmsNorm};
use crate::modules::transformer::{CausalSelfAttention, GatedMlp, KvCache};
use crate::param::{Init, Mode, Path};
use crate::Module;
use coil_frontend::{CrossEntropyOptions, Tensor};
use coil_ir::{DType, Error, Result};

/// A Llama's sizes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LlamaConfig {
    /// Tokens in the vocabulary.
    pub vocab_size: usize,
    /// The embedding width.
    pub hidden_size: usize,
    /// The gated MLP's hidden width.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub n_layer: usize,
    /// Query heads per layer.
    pub n_head: usize,
    /// Key/value heads (grouped-query attention when fewer than `n_head`).
    pub n_kv_head: usize,
    /// The epsilon of every RMS norm.
    pub rms_norm_eps: f64,
    /// The rotary embedding's base frequency.
    pub rope_theta: f64,
    /// The longest sequence (the rotary tables' length).
    pub max_positions: usize,
    /// The output projection is the embedding table.
    pub tie_word_embeddings: bool,
}

impl LlamaConfig {
    /// A tiny Llama (2 layers of 64 features, 4 query and 2 key/value heads, 256 tokens, 128
    /// positions, tied embeddings): for tests and examples.
    pub fn tiny() -> LlamaConfig {
        LlamaConfig {
            vocab_size: 256,
            hidden_size: 64,
            intermediate_size: 96,
            n_layer: 2,
            n_head: 4,
            n_kv_head: 2,
            rms_norm_eps: 1e-5,
            rope_theta: 500000.0,
            max_positions: 128,
            tie_word_embeddings: true,
        }
    }

    /// Llama 3.2 1B's sizes (1.24B parameters; the rotary tables cut to 4096 positions).
    pub fn llama_1b() -> LlamaConfig {
        LlamaConfig {
            vocab_size: 128256,
            hidden_size: 2048,
            intermediate_size: 8192,
            n_layer: 16,
            n_head: 32,
            n_kv_head: 8,
            rms_norm_eps: 1e-5,
            rope_theta: 500000.0,
            max_positions: 4096,
            tie_word_embeddings: true,
        }
    }

    /// The sizes in a Hugging Face `config.json` (`rope_theta` at the top level, or under
    /// `rope_parameters` as newer versions write it).
    ///
    /// ```
    /// let c = coil_nn::models::llama::LlamaConfig::from_hf_json(r#"{"vocab_size": 37, "hidden_size": 16,
    ///     "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4,
    ///     "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    ///     "max_position_embeddings": 16, "tie_word_embeddings": false}"#)?;
    /// assert_eq!((c.n_layer, c.n_kv_head, c.rope_theta), (2, 2, 10000.0));
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    pub fn from_hf_json(text: &str) -> Result<LlamaConfig> {
        let json: serde_json::Value =
            serde_json::from_str(text).map_err(|e| Error::value(format!("config.json: {e}")))?;
        let num = |k: &str| json[k].as_f64().ok_or_else(|| Error::value(format!("config.json has no number {k}")));
        let int = |k: &str| num(k).map(|v| v as usize);
        let n_head = int("num_attention_heads")?;
        Ok(LlamaConfig {
            vocab_size: int("vocab_size")?,
            hidden_size: int("hidden_size")?,
            intermediate_size: int("intermediate_size")?,
            n_layer: int("num_hidden_layers")?,
            n_head,
            n_kv_head: int("num_key_value_heads").unwrap_or(n_head),
            rms_norm_eps: num("rms_norm_eps")?,
            rope_theta: json["rope_parameters"]["rope_theta"].as_f64().map_or_else(|| num("rope_theta"), Ok)?,
            max_positions: int("max_position_embeddings")?,
            tie_word_embeddings: json["tie_word_embeddings"].as_bool().unwrap_or(false),
        })
    }
}

/// One decoder layer: `x + self_attn(input_layernorm(x))`, then `x + mlp(post_attention_layernorm(x))`.
#[derive(Clone, Debug)]
pub struct LlamaLayer {
    /// The norm before attention.
    pub input_layernorm: RmsNorm,
    /// Causal self-attention with rotary embeddings.
    pub self_attn: CausalSelfAttention,
    /// The norm before the MLP.
    pub post_attention_layernorm: RmsNorm,
    /// The gated MLP.
    pub mlp: GatedMlp,
}

/// Llama with its language-model head.
#[derive(Clone, Debug)]
pub struct Llama {
    /// The sizes it was built with.
    pub config: LlamaConfig,
    /// Token embeddings `[vocab_size, hidden_size]`.
    pub embed_tokens: Embedding,
    /// The decoder layers (`layers.0`, ...).
    pub layers: Vec<LlamaLayer>,
    /// The final RMS norm.
    pub norm: RmsNorm,
    /// `None` when tied to `embed_tokens`.
    pub lm_head: Option<Linear>,
    mode: Mode,
}

impl Llama {
    /// A Llama under `path` (`model.*` and `lm_head.weight`), parameters drawn from
    /// `N(0, 0.02)` (Hugging Face's `initializer_range`) and norms of ones.
    #[track_caller]
    pub fn new(path: &Path, config: LlamaConfig) -> Result<Llama> {
        let c = config.hidden_size;
        let m = path.pp("model");
        let normal = Init::Normal { mean: 0.0, std: 0.02 };
        let embed_tokens = Embedding::with_init(&m.pp("embed_tokens"), config.vocab_size, c, normal)?;
        let mut layers = Vec::with_capacity(config.n_layer);
        for i in 0..config.n_layer {
            let p = m.pp("layers").pp(i);
            let eps = Some(config.rms_norm_eps);
            layers.push(LlamaLayer {
                input_layernorm: RmsNorm::new(&p.pp("input_layernorm"), c, eps)?,
                self_attn: CausalSelfAttention::llama(
                    &p.pp("self_attn"),
                    c,
                    config.n_head,
                    config.n_kv_head,
                    config.max_positions,
                    config.rope_theta,
                )?,
                post_attention_layernorm: RmsNorm::new(&p.pp("post_attention_layernorm"), c, eps)?,
                mlp: GatedMlp::new(&p.pp("mlp"), c, config.intermediate_size)?,
            });
        }
        let norm = RmsNorm::new(&m.pp("norm"), c, Some(config.rms_norm_eps))?;
        let lm_head = if config.tie_word_embeddings {
            None
        } else {
            let head = path.pp("lm_head");
            Some(Linear::with_init(&head, c, config.vocab_size, false, Layout::OutIn, normal, Init::Zeros)?)
        };
        Ok(Llama { config, embed_tokens, layers, norm, lm_head, mode: path.mode() })
    }

    /// The logits of the final hidden states `x` (`[..., C]`).
    fn head(&self, x: &Tensor) -> Result<Tensor> {
        match &self.lm_head {
            Some(head) => head.forward(x),
            None => {
                let dtype = self.mode.compute_dtype(x.dtype());
                coil_frontend::linear(&x.to_dtype(dtype)?, &self.embed_tokens.weight.tensor().to_dtype(dtype)?, None)
            }
        }
    }

    /// The logits `[B, T, vocab]` of token ids `idx` `[B, T]`.
    #[track_caller]
    pub fn forward(&self, idx: &Tensor) -> Result<Tensor> {
        let mut x = self.embed_tokens.forward(idx)?;
        for layer in &self.layers {
            x = x.add(&layer.self_attn.forward(&layer.input_layernorm.forward(&x)?)?)?;
            x = x.add(&layer.mlp.forward(&layer.post_attention_layernorm.forward(&x)?)?)?;
        }
        self.head(&self.norm.forward(&x)?)
    }

    /// The mean cross-entropy of the next-token predictions against `targets`, in f32.
    #[track_caller]
    pub fn loss(&self, idx: &Tensor, targets: &Tensor) -> Result<Tensor> {
        let logits = self.forward(idx)?.reshape(&[-1, self.config.vocab_size as i64])?.to_dtype(DType::F32)?;
        logits.cross_entropy(&targets.reshape(&[-1])?, CrossEntropyOptions::default())
    }

    /// One step of incremental decoding (or a prefill), as [`crate::models::gpt2::Gpt2::forward_cached`]:
    /// the last position's logits (f32) and each layer's cache with this step written.
    #[track_caller]
    pub fn forward_cached(
        &self,
        idx: &Tensor,
        pos: &Tensor,
        cache: &KvCache,
    ) -> Result<(Tensor, Vec<(Tensor, Tensor)>)> {
        let &[_, t] = idx.shape() else {
            return Err(
                Error::shape(format!("Llama expects token ids [B, T], got {}", idx.meta())).in_op("Llama", vec![])
            );
        };
        if t == 0 || cache.len() + t > cache.capacity().min(self.config.max_positions) {
            return Err(Error::shape(format!("{t} more tokens after {} do not fit the cache", cache.len()))
                .in_op("Llama::forward_cached", vec![idx.meta().to_string()]));
        }
        let mut x = self.embed_tokens.forward(idx)?;
        let mut written = Vec::with_capacity(self.layers.len());
        for (i, layer) in self.layers.iter().enumerate() {
            let h = layer.input_layernorm.forward(&x)?;
            let (y, k, v) = layer.self_attn.forward_cached(&h, pos, &cache.k[i], &cache.v[i])?;
            x = x.add(&y)?;
            x = x.add(&layer.mlp.forward(&layer.post_attention_layernorm.forward(&x)?)?)?;
            written.push((k, v));
        }
        let last = self.norm.forward(&x.select(1, t as i64 - 1)?)?;
        Ok((self.head(&last)?.to_dtype(DType::F32)?, written))
    }

    /// An empty key/value cache for `batch` sequences of up to `capacity` tokens.
    #[track_caller]
    pub fn new_cache(&self, batch: usize, capacity: usize) -> Result<KvCache> {
        let (heads, d) = self.layers.first().map_or((self.config.n_kv_head, 0), |l| l.self_attn.kv_shape());
        let dtype = self.mode.compute_dtype(self.embed_tokens.weight.dtype());
        KvCache::new(self.layers.len(), batch, heads, capacity, d, dtype, self.embed_tokens.weight.device())
    }
}
