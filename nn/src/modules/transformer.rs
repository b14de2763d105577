//! Transformer pieces: causal self-attention (GPT-2's fused projection, or Llama's separate
//! ones with grouped-query heads and rotary embeddings), the GELU MLP, the gated (SwiGLU) MLP,
//! and rotary position embeddings.

use crate::modules::layers::{Dropout, Layout, Linear};
use crate::param::{Init, Mode, Path};
use crate::Module;
use coil_frontend::{scaled_dot_product_attention, scaled_dot_product_attention_dropout, Tensor};
use coil_ir::{DType, Error, Result};
use coil_runtime::Device;

/// Causal multi-head self-attention through `scaled_dot_product_attention`.
///
/// Two parameter layouts, by name:
/// * GPT-2 ([`CausalSelfAttention::gpt2`]): `c_attn` (`[C, 3C]`, Conv1D layout, with bias)
///   projects to q, k and v at once, `c_proj` projects back;
/// * Llama ([`CausalSelfAttention::llama`]): `q_proj`, `k_proj`, `v_proj`, `o_proj` (`nn.Linear`
///   layout, no bias), with fewer key/value heads than query heads (grouped-query attention)
///   and rotary position embeddings.
#[derive(Clone, Debug)]
pub struct CausalSelfAttention {
    projections: Projections,
    out: Linear,
    n_head: usize,
    n_kv_head: usize,
    rotary: Option<Rotary>,
    attn_dropout: f64,
    resid_dropout: Dropout,
    mode: Mode,
}

#[derive(Clone, Debug)]
enum Projections {
    Fused(Linear),
    Separate { q: Linear, k: Linear, v: Linear },
}

impl CausalSelfAttention {
    /// GPT-2's attention over `n_embd` features in `n_head` heads: parameters `c_attn.weight`
    /// `[C, 3C]`, `c_attn.bias`, `c_proj.weight` `[C, C]`, `c_proj.bias`. `c_proj` draws from
    /// `N(0, proj_std)` (GPT-2 scales it by `1/sqrt(2 n_layer)`).
    #[track_caller]
    pub fn gpt2(path: &Path, n_embd: usize, n_head: usize, dropout: f64, proj_std: f64) -> Result<Self> {
        check_heads(n_embd, n_head, n_head)?;
        let c_attn = Linear::conv1d(&path.pp("c_attn"), n_embd, 3 * n_embd)?;
        let proj = Init::Normal { mean: 0.0, std: proj_std };
        let c_proj = Linear::with_init(&path.pp("c_proj"), n_embd, n_embd, true, Layout::InOut, proj, Init::Zeros)?;
        Ok(CausalSelfAttention {
            projections: Projections::Fused(c_attn),
            out: c_proj,
            n_head,
            n_kv_head: n_head,
            rotary: None,
            attn_dropout: dropout,
            resid_dropout: Dropout::new(path, dropout),
            mode: path.mode(),
        })
    }

    /// Llama's attention: `q_proj` `[C, C]`, `k_proj` and `v_proj` `[n_kv_head * D, C]`,
    /// `o_proj` `[C, C]` (no biases), rotary embeddings with base `rope_theta` over positions
    /// up to `max_positions`.
    #[track_caller]
    pub fn llama(
        path: &Path,
        n_embd: usize,
        n_head: usize,
        n_kv_head: usize,
        max_positions: usize,
        rope_theta: f64,
    ) -> Result<Self> {
        check_heads(n_embd, n_head, n_kv_head)?;
        let d = n_embd / n_head;
        let q = Linear::new(&path.pp("q_proj"), n_embd, n_embd, false)?;
        let k = Linear::new(&path.pp("k_proj"), n_embd, n_kv_head * d, false)?;
        let v = Linear::new(&path.pp("v_proj"), n_embd, n_kv_head * d, false)?;
        let o = Linear::new(&path.pp("o_proj"), n_embd, n_embd, false)?;
        Ok(CausalSelfAttention {
            projections: Projections::Separate { q, k, v },
            out: o,
            n_head,
            n_kv_head,
            rotary: Some(Rotary::new(d, max_positions, rope_theta, path.device())?),
            attn_dropout: 0.0,
            resid_dropout: Dropout::new(path, 0.0),
            mode: path.mode(),
        })
    }
}

fn check_heads(n_embd: usize, n_head: usize, n_kv_head: usize) -> Result<()> {
    if n_head == 0 || n_kv_head == 0 || !n_embd.is_multiple_of(n_head) || !n_head.is_multiple_of(n_kv_head) {
        return Err(Error::value(format!(
            "attention: {n_embd} features do not split into {n_head} heads with {n_kv_head} key/value heads"
        ))
        .in_op("CausalSelfAttention", vec![]));
    }
    Ok(())
}

impl Module for CausalSelfAttention {
    /// `x` is `[B, T, C]`; so is the result.
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let &[b, t, c] = x.shape() else {
            return Err(Error::shape(format!("attention expects [B, T, C] input, got {}", x.meta()))
                .in_op("CausalSelfAttention", vec![x.meta().to_string()]));
        };
        let (h, hkv) = (self.n_head as i64, self.n_kv_head as i64);
        let d = (c / self.n_head) as i64;
        let (b, t) = (b as i64, t as i64);
        let heads = |y: &Tensor, n: i64| y.reshape(&[b, t, n, d])?.transpose(1, 2);
        let (q, k, v) = match &self.projections {
            Projections::Fused(c_attn) => {
                let qkv = c_attn.forward(x)?.split(c, 2)?;
                (heads(&qkv[0], h)?, heads(&qkv[1], h)?, heads(&qkv[2], h)?)
            }
            Projections::Separate { q, k, v } => {
                (heads(&q.forward(x)?, h)?, heads(&k.forward(x)?, hkv)?, heads(&v.forward(x)?, hkv)?)
            }
        };
        let (q, k) = match &self.rotary {
            Some(r) => (r.apply(&q, 0)?, r.apply(&k, 0)?),
            None => (q, k),
        };
        let (k, v) = (repeat_kv(&k, h / hkv)?, repeat_kv(&v, h / hkv)?);
        // Dropout on the attention weights in training only (one template call either way).
        let p = if self.mode.training() { self.attn_dropout } else { 0.0 };
        let y = scaled_dot_product_attention_dropout(&q, &k, &v, None, p, true, None)?;
        let y = y.transpose(1, 2)?.reshape(&[b, t, c as i64])?;
        self.resid_dropout.forward(&self.out.forward(&y)?)
    }
}

/// Each of `n_rep` query heads shares a key/value head: `[B, Hkv, T, D]` to `[B, Hkv*n_rep, T, D]`.
fn repeat_kv(x: &Tensor, n_rep: i64) -> Result<Tensor> {
    if n_rep == 1 {
        return Ok(x.clone());
    }
    let s: Vec<i64> = x.shape().iter().map(|&n| n as i64).collect();
    x.unsqueeze(2)?.expand(&[s[0], s[1], n_rep, s[2], s[3]])?.reshape(&[s[0], s[1] * n_rep, s[2], s[3]])
}

/// GPT-2's MLP: `c_proj(gelu_tanh(c_fc(x)))` with Conv1D-layout projections `c_fc` `[C, 4C]`
/// and `c_proj` `[4C, C]`, then dropout.
#[derive(Clone, Debug)]
pub struct Mlp {
    /// The expansion `[C, 4C]`.
    pub c_fc: Linear,
    /// The projection back `[4C, C]`.
    pub c_proj: Linear,
    dropout: Dropout,
}

impl Mlp {
    /// `c_proj` draws from `N(0, proj_std)` (GPT-2 scales it by `1/sqrt(2 n_layer)`).
    #[track_caller]
    pub fn gpt2(path: &Path, n_embd: usize, dropout: f64, proj_std: f64) -> Result<Mlp> {
        let c_fc = Linear::conv1d(&path.pp("c_fc"), n_embd, 4 * n_embd)?;
        let proj = Init::Normal { mean: 0.0, std: proj_std };
        let c_proj = Linear::with_init(&path.pp("c_proj"), 4 * n_embd, n_embd, true, Layout::InOut, proj, Init::Zeros)?;
        Ok(Mlp { c_fc, c_proj, dropout: Dropout::new(path, dropout) })
    }
}

impl Module for Mlp {
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.dropout.forward(&self.c_proj.forward(&self.c_fc.forward(x)?.gelu(true)?)?)
    }
}

/// The gated MLP of Llama (SwiGLU): `down_proj(silu(gate_proj(x)) * up_proj(x))`, `nn.Linear`
/// layouts without bias.
#[derive(Clone, Debug)]
pub struct GatedMlp {
    /// The gate `[dim] -> [hidden]`, through silu.
    pub gate_proj: Linear,
    /// The value `[dim] -> [hidden]`.
    pub up_proj: Linear,
    /// The projection back `[hidden] -> [dim]`.
    pub down_proj: Linear,
}

impl GatedMlp {
    /// The three projections of width `dim` and hidden width `hidden`, `nn.Linear` initialization.
    #[track_caller]
    pub fn new(path: &Path, dim: usize, hidden: usize) -> Result<GatedMlp> {
        Ok(GatedMlp {
            gate_proj: Linear::new(&path.pp("gate_proj"), dim, hidden, false)?,
            up_proj: Linear::new(&path.pp("up_proj"), dim, hidden, false)?,
            down_proj: Linear::new(&path.pp("down_proj"), hidden, dim, false)?,
        })
    }
}

impl Module for GatedMlp {
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let gate = self.gate_proj.forward(x)?.silu()?;
        self.down_proj.forward(&gate.mul(&self.up_proj.forward(x)?)?)
    }
}

/// Rotary position embeddings (RoPE) in Hugging Face Llama's convention: position `p` rotates
/// the pair `(x[i], x[i + D/2])` by `p * base^(-2i/D)` (`rotate_half`).
///
/// ```
/// use coil_nn::Rotary;
/// use coil_frontend::Tensor;
/// use coil_ir::DType;
/// let rope = Rotary::new(4, 16, 10000.0, coil_runtime::Device::Cpu)?;
/// let q = Tensor::ones(&[1, 1, 3, 4], DType::F32);
/// let r = rope.apply(&q, 0)?.to_vec::<f32>()?;
/// assert_eq!(&r[..4], &[1.0, 1.0, 1.0, 1.0]); // position 0: no rotation
/// # Ok::<(), coil_ir::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Rotary {
    /// `[max_positions, D]` tables, f32, computed.
    cos: Tensor,
    sin: Tensor,
}

impl Rotary {
    /// Tables for head dim `dim` (even) over positions `0..max_positions`, on `device`.
    #[track_caller]
    pub fn new(dim: usize, max_positions: usize, base: f64, device: Device) -> Result<Rotary> {
        if !dim.is_multiple_of(2) || dim == 0 {
            return Err(
                Error::value(format!("rotary embeddings need an even head dim, got {dim}")).in_op("Rotary", vec![])
            );
        }
        let half = dim / 2;
        // Angles in f64, rounded once to f32 (HF computes inv_freq in f32; the difference is
        // within f32 rounding of the angle).
        let mut cos = Vec::with_capacity(max_positions * dim);
        let mut sin = Vec::with_capacity(max_positions * dim);
        for p in 0..max_positions {
            for i in 0..dim {
                let inv_freq = base.powf(-2.0 * (i % half) as f64 / dim as f64);
                let angle = p as f64 * inv_freq;
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        let table = |v: Vec<f32>| Tensor::from_vec(v, &[max_positions, dim])?.to_device(device);
        Ok(Rotary { cos: table(cos)?, sin: table(sin)? })
    }

    /// `x` (`[..., T, D]`) at positions `start..start + T`, rotated.
    #[track_caller]
    pub fn apply(&self, x: &Tensor, start: usize) -> Result<Tensor> {
        let rank = x.rank();
        let (t, d) = (x.shape()[rank - 2], x.shape()[rank - 1]);
        let cos = self.cos.narrow(0, start as i64, t)?;
        let sin = self.sin.narrow(0, start as i64, t)?;
        rotate(x, &cos, &sin, d)
    }
}

/// Keys and values of the positions seen so far, per layer, in buffers of a fixed capacity
/// (`[batch, kv_heads, capacity, head_dim]`). A step writes its positions into them in place
/// (at a position given as a tensor) and attends to the valid prefix through a mask, so a decode
/// step is the same graph at every position: it compiles once.
///
/// ```
/// use coil_nn::KvCache;
/// use coil_ir::DType;
/// let cache = KvCache::new(2, 1, 4, 16, 8, DType::F32, coil_runtime::Device::Cpu)?;
/// assert_eq!((cache.len(), cache.capacity()), (0, 16));
/// assert_eq!(cache.k[1].shape(), &[1, 4, 16, 8]);
/// # Ok::<(), coil_ir::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct KvCache {
    /// Per layer, the keys.
    pub k: Vec<Tensor>,
    /// Per layer, the values.
    pub v: Vec<Tensor>,
    len: usize,
}

impl KvCache {
    /// An empty cache (zeros, computed).
    #[track_caller]
    pub fn new(
        layers: usize,
        batch: usize,
        kv_heads: usize,
        capacity: usize,
        head_dim: usize,
        dtype: DType,
        device: Device,
    ) -> Result<KvCache> {
        let shape = [batch, kv_heads, capacity, head_dim];
        let zeros = |_| Tensor::zeros(&shape, dtype).to_device(device);
        let (k, v): (Vec<Tensor>, Vec<Tensor>) =
            ((0..layers).map(zeros).collect::<Result<_>>()?, (0..layers).map(zeros).collect::<Result<_>>()?);
        coil_frontend::realize(&k.iter().chain(&v).collect::<Vec<_>>())?;
        let k = k.iter().map(Tensor::detach).collect::<Result<_>>()?;
        let v = v.iter().map(Tensor::detach).collect::<Result<_>>()?;
        Ok(KvCache { k, v, len: 0 })
    }

    /// Positions written so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position was written yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions it holds at most.
    pub fn capacity(&self) -> usize {
        self.k.first().map_or(0, |k| k.shape()[2])
    }

    /// The position of the next step as a 0-d i64 tensor on the cache's device (a run-time
    /// value: the step's graph does not depend on it).
    pub fn position(&self) -> Result<Tensor> {
        let device = self.k.first().map_or(Device::Cpu, |k| k.device());
        Tensor::from_vec(vec![self.len as i64], &[])?.to_device(device)
    }

    /// Counts `steps` more positions as written: a compiled function wrote them with
    /// [`KvCache::write`] (a prefill compiled with `CompiledFn::replay`, whose replayed calls do
    /// not run the Rust code that would [`KvCache::commit`]). An error past the capacity.
    ///
    /// ```
    /// use coil_nn::models::{gpt2::{Gpt2, Gpt2Config}, CausalLm};
    /// use coil_nn::ParamStore;
    /// # fn main() -> coil_ir::Result<()> {
    /// let config = Gpt2Config { vocab_size: 11, block_size: 8, n_layer: 1, n_head: 2, n_embd: 8, dropout: 0.0, layer_norm_eps: 1e-5 };
    /// let model = Gpt2::new(&ParamStore::new().root(coil_runtime::Device::Cpu, coil_ir::DType::F32), config)?;
    /// let mut cache = model.new_cache(1, 8)?;
    /// cache.advance(5)?;
    /// assert_eq!(cache.position()?.item::<i64>()?, 5);
    /// assert!(cache.advance(4).is_err());
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn advance(&mut self, steps: usize) -> Result<()> {
        self.room(steps, "KvCache::advance")?;
        self.len += steps;
        Ok(())
    }

    /// An error for `op` unless `steps` more positions fit.
    fn room(&self, steps: usize, op: &str) -> Result<()> {
        if self.len + steps > self.capacity() {
            return Err(Error::value(format!(
                "the cache holds {} positions: {} + {steps} do not fit",
                self.capacity(),
                self.len
            ))
            .in_op(op, vec![]));
        }
        Ok(())
    }

    /// Writes a step's new keys and values (`updates[layer] = (k, v)`, as
    /// [`CausalSelfAttention::forward_cached`] returns them) over the cache in place, computing
    /// `also` (the step's logits) in the same graph; the step covered `steps` positions.
    #[track_caller]
    pub fn commit(&mut self, updates: &[(Tensor, Tensor)], steps: usize, also: &[&Tensor]) -> Result<()> {
        self.room(steps, "KvCache::commit")?;
        self.write(updates, also)?;
        self.len += steps;
        Ok(())
    }

    /// [`KvCache::commit`] for a step whose position the caller keeps (a tensor, passed to
    /// each step): the keys and values are written over the cache in place, and
    /// [`KvCache::len`] stays as it is. A decode step compiled with replay
    /// (`CompiledFn::replay`) writes this way, since a replayed call does not run the Rust code
    /// that would count positions; the caller keeps the positions within the capacity.
    ///
    /// ```
    /// use coil_frontend::{dynamo, Tensor};
    /// use coil_nn::models::{gpt2::{Gpt2, Gpt2Config}, CausalLm};
    /// use coil_nn::ParamStore;
    /// use std::cell::RefCell;
    /// # fn main() -> coil_ir::Result<()> {
    /// let config = Gpt2Config { vocab_size: 11, block_size: 8, n_layer: 1, n_head: 2, n_embd: 8, dropout: 0.0, layer_norm_eps: 1e-5 };
    /// let store = ParamStore::new();
    /// let model = Gpt2::new(&store.root(coil_runtime::Device::Cpu, coil_ir::DType::F32), config)?;
    /// store.realize_pending()?; // the weights, computed before the first step
    /// let cache = RefCell::new(model.new_cache(1, 8)?);
    /// let step = dynamo::compile(|a: &[Tensor]| {
    ///     let mut cache = cache.borrow_mut();
    ///     let (logits, written) = model.forward_cached(&a[0], &a[1], &cache)?;
    ///     cache.write(&written, &[])?;
    ///     Ok(vec![logits.argmax(Some(-1), false)?.reshape(&[1, 1])?, &a[1] + 1i64])
    /// })
    /// .replay(true);
    /// let (mut token, mut pos) = (Tensor::from_vec(vec![3i64], &[1, 1])?, Tensor::from_vec(vec![0i64], &[])?);
    /// for _ in 0..4 {
    ///     let out = step.call(&[&token, &pos])?;
    ///     (token, pos) = (out[0].clone(), out[1].clone());
    /// }
    /// assert_eq!((pos.item::<i64>()?, step.stats().replays), (4, 2));
    /// # Ok(()) }
    /// ```
    #[track_caller]
    pub fn write(&mut self, updates: &[(Tensor, Tensor)], also: &[&Tensor]) -> Result<()> {
        let mut pairs: Vec<(&Tensor, &Tensor)> = Vec::with_capacity(2 * updates.len());
        for (layer, (k, v)) in updates.iter().enumerate() {
            pairs.push((&self.k[layer], k));
            pairs.push((&self.v[layer], v));
        }
        let written = coil_frontend::update_in_place_with(&pairs, also)?;
        for (layer, kv) in written.chunks(2).enumerate() {
            (self.k[layer], self.v[layer]) = (kv[0].clone(), kv[1].clone());
        }
        Ok(())
    }

    /// Forgets the positions written (the buffers are kept, and written over by the next
    /// sequence: attention reads only the positions before a step's).
    pub fn clear(&mut self) {
        self.len = 0;
    }
}

/// `cache` with `new` (`[B, H, T, D]`) written at positions `pos..pos + T` (`pos` a 0-d i64
/// tensor, `pos + T` within the capacity: [`KvCache::commit`] checks it, and so does the
/// kernel): a scatter along the positions (PyTorch's `index_copy_`). The compiler makes it a
/// generated kernel over the `B * H * T * D` new elements that computes them (the rotary
/// embedding of the keys) and stores them at the position it reads when it runs, over the
/// cache's buffer when the cache is donated (`coil_ir::loops::ScatterStore`).
fn write_positions(cache: &Tensor, new: &Tensor, pos: &Tensor) -> Result<Tensor> {
    let t = new.shape()[2];
    let positions = Tensor::iota(&[t], 0)?.to_device(cache.device())?.add(pos)?.reshape(&[1, 1, t as i64, 1])?;
    let index = positions.broadcast_to(new.shape())?;
    cache.scatter(2, &index, &new.to_dtype(cache.dtype())?)
}

impl CausalSelfAttention {
    /// One step of incremental decoding (or a prefill): `x` (`[B, T, C]`) at positions
    /// `pos..pos + T` attends to the cache's earlier positions and to itself, causally. Returns
    /// the output and the layer's cache with this step's keys and values written (commit them
    /// with [`KvCache::commit`]).
    #[track_caller]
    pub fn forward_cached(
        &self,
        x: &Tensor,
        pos: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let &[b, t, c] = x.shape() else {
            return Err(Error::shape(format!("attention expects [B, T, C] input, got {}", x.meta()))
                .in_op("CausalSelfAttention", vec![x.meta().to_string()]));
        };
        let (h, hkv, d) = (self.n_head as i64, self.n_kv_head as i64, (c / self.n_head) as i64);
        let heads = |y: &Tensor, n: i64| y.reshape(&[b as i64, t as i64, n, d])?.transpose(1, 2);
        let (q, k, v) = match &self.projections {
            Projections::Fused(c_attn) => {
                let qkv = c_attn.forward(x)?.split(c, 2)?;
                (heads(&qkv[0], h)?, heads(&qkv[1], h)?, heads(&qkv[2], h)?)
            }
            Projections::Separate { q, k, v } => {
                (heads(&q.forward(x)?, h)?, heads(&k.forward(x)?, hkv)?, heads(&v.forward(x)?, hkv)?)
            }
        };
        let device = x.device();
        let positions = Tensor::arange(0, t as i64, 1, DType::I64)?.to_device(device)?.add(pos)?;
        let (q, k) = match &self.rotary {
            Some(r) => (r.apply_at(&q, &positions)?, r.apply_at(&k, &positions)?),
            None => (q, k),
        };
        let (k_all, v_all) = (write_positions(k_cache, &k, pos)?, write_positions(v_cache, &v, pos)?);
        // The query heads that share a key/value head are rows of one matrix (no copy of the
        // cache per query head): row r of group g is head g * rep + r / T at position pos + r % T.
        let rep = h / hkv;
        let (bi, ti) = (b as i64, t as i64);
        let q = q.reshape(&[bi, hkv, rep * ti, d])?;
        let rows = Tensor::arange(0, rep * ti, 1, DType::I64)?.to_device(device)?.remainder(ti)?.add(pos)?;
        // Row r sees the keys at positions up to its own. Compiled, the compiler recognizes the
        // rule (`key <= pos + r % T`) and this is one attention template call per layer that
        // never computes or reads the `[rep * T, cap]` mask and skips the key tiles past each
        // block's last position (on CUDA, for a decode step, the split-KV kernels).
        let cap = k_cache.shape()[2];
        let keys = Tensor::iota(&[1, cap], 1)?.to_device(device)?;
        let mask = keys.le(&rows.reshape(&[rep * ti, 1])?)?;
        let (k_all_q, v_all_q) = (k_all.to_dtype(q.dtype())?, v_all.to_dtype(q.dtype())?);
        let y = scaled_dot_product_attention(&q, &k_all_q, &v_all_q, Some(&mask), false, None)?;
        let y = y.reshape(&[bi, h, ti, d])?.transpose(1, 2)?.reshape(&[bi, ti, c as i64])?;
        Ok((self.resid_dropout.forward(&self.out.forward(&y)?)?, k_all, v_all))
    }

    /// The layer's key/value heads and head size (for sizing a [`KvCache`]).
    pub fn kv_shape(&self) -> (usize, usize) {
        let d = match &self.projections {
            Projections::Fused(c_attn) => c_attn.weight.shape()[0] / self.n_head,
            Projections::Separate { q, .. } => q.weight.shape()[1] / self.n_head,
        };
        (self.n_kv_head, d)
    }
}

impl Rotary {
    /// `x` (`[..., T, D]`) rotated at `positions` (`[T]` i64, run-time values).
    #[track_caller]
    pub fn apply_at(&self, x: &Tensor, positions: &Tensor) -> Result<Tensor> {
        let d = x.shape()[x.rank() - 1];
        rotate(x, &self.cos.index_select(0, positions)?, &self.sin.index_select(0, positions)?, d)
    }
}

/// `x cos + rotate_half(x) sin`, with `rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2])`.
fn rotate(x: &Tensor, cos: &Tensor, sin: &Tensor, d: usize) -> Result<Tensor> {
    let (lo, hi) = (x.narrow(-1, 0, d / 2)?, x.narrow(-1, (d / 2) as i64, d / 2)?);
    let rotated = coil_frontend::cat(&[&hi.neg()?, &lo], -1)?;
    x.mul(&cos.to_dtype(x.dtype())?)?.add(&rotated.mul(&sin.to_dtype(x.dtype())?)?)
}
