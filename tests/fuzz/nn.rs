//! The steps that call nn functions, matrix products and creation functions (the other op
//! families are in `ops.rs`).

use crate::gen::Gen;
use coil::{CrossEntropyOptions, DType, LossReduction, Result, Tensor};

impl Gen {
    pub fn nn(&mut self) -> Result<()> {
        let (name, x) = self.operand();
        let rank = x.rank();
        match self.rng.below(9) {
            0 | 1 => {
                let d = self.dim(rank);
                if self.rng.chance(50) {
                    self.push(format!("{name}.softmax({d})"), x.softmax(d))
                } else {
                    self.push(format!("{name}.log_softmax({d})"), x.log_softmax(d))
                }
            }
            2 | 3 => self.norm(name, x),
            4 => {
                let p = if self.wild() { 1.5 } else { self.rng.pick(&[0.0, 0.25, 1.0]) };
                let train = self.rng.chance(80);
                self.push(format!("{name}.dropout({p:?}, {train})"), x.dropout(p, train))
            }
            5 => self.cross_entropy(name, x),
            6 => {
                let shape = if self.wild() { self.shape() } else { self.broadcastable(x.shape()) };
                let dtype = if self.rng.chance(70) { x.dtype() } else { self.dtype() };
                let (text, target) = self.data(dtype, &shape)?;
                let reduction = self.reduction();
                self.push(format!("{name}.mse_loss(&{text}, {reduction:?})"), x.mse_loss(&target, reduction))
            }
            7 => {
                // `x` as the table when it is a matrix, else a new table; indices of any rank.
                let (wname, weight) = if rank == 2 || self.wild() {
                    (name, x)
                } else {
                    let (n, dim) = (1 + self.rng.below(5), self.size());
                    let dtype = self.float_dtype();
                    self.data(dtype, &[n, dim])?
                };
                let rows = weight.shape().first().copied().unwrap_or(1);
                let shape: Vec<usize> = (0..self.rng.below(3)).map(|_| self.size()).collect();
                let (text, idx) = self.indices(&shape, 0, rows as i64 - 1)?;
                self.push(format!("coil::embedding(&{text}, &{wname})"), coil::embedding(&idx, &weight))
            }
            _ => self.attention(name, x),
        }
    }

    /// `layer_norm` or `rms_norm` over the last one or two dims, with parameters of that shape.
    fn norm(&mut self, name: String, x: Tensor) -> Result<()> {
        let k = if self.wild() { 1 + x.rank() } else { self.rng.range(1, x.rank().clamp(1, 2) as i64) as usize };
        let shape: Vec<usize> = x.shape()[x.rank().saturating_sub(k)..].to_vec();
        let dtype = if self.wild() { DType::I32 } else { x.dtype() };
        let param = |g: &mut Gen| -> Result<Option<(String, Tensor)>> {
            if g.rng.chance(50) {
                g.data(dtype, &shape).map(Some)
            } else {
                Ok(None)
            }
        };
        let (w, b) = (param(self)?, param(self)?);
        let text = |p: &Option<(String, Tensor)>| p.as_ref().map_or("None".to_string(), |(t, _)| format!("Some(&{t})"));
        let (wt, bt) = (text(&w), text(&b));
        let (w, b) = (w.map(|p| p.1), b.map(|p| p.1));
        if self.rng.chance(60) {
            let eps = self.rng.pick(&[1e-5, 0.0]);
            let call = format!("{name}.layer_norm(&{shape:?}, {wt}, {bt}, {eps:?})");
            self.push(call, x.layer_norm(&shape, w.as_ref(), b.as_ref(), eps))
        } else {
            let eps = self.rng.pick(&[None, Some(1e-6)]);
            self.push(format!("{name}.rms_norm(&{shape:?}, {wt}, {eps:?})"), x.rms_norm(&shape, w.as_ref(), eps))
        }
    }

    fn reduction(&mut self) -> LossReduction {
        self.rng.pick(&[LossReduction::Mean, LossReduction::Sum, LossReduction::None])
    }

    /// `cross_entropy` (weighted now and then) of `x` as logits `[N, C]` or `[C]`, with class
    /// targets (some equal to `ignore_index`).
    fn cross_entropy(&mut self, name: String, x: Tensor) -> Result<()> {
        let classes = x.shape().last().copied().unwrap_or(1);
        let batch: Vec<usize> = if x.rank() >= 2 { vec![x.shape()[0]] } else { vec![] };
        let n = coil::ir::graph::numel(&batch);
        let (text, target) = if self.rng.chance(20) && n <= crate::gen::RUN_LIMIT {
            let values: Vec<f64> = (0..n).map(|_| self.rng.pick(&[-100.0, 0.0])).collect();
            let text = format!("input(DType::I64, &{batch:?}, &{values:?})");
            (text, crate::gen::input(DType::I64, &batch, &values)?.to_device(x.device())?)
        } else {
            self.indices(&batch, 0, classes as i64 - 1)?
        };
        let options = CrossEntropyOptions {
            reduction: self.reduction(),
            label_smoothing: if self.wild() { 2.0 } else { self.rng.pick(&[0.0, 0.0, 0.1]) },
            ..Default::default()
        };
        if self.rng.chance(30) {
            let (wtext, weight) = self.data(x.dtype(), &[classes])?;
            let call = format!("{name}.cross_entropy_weighted(&{text}, &{wtext}, {options:?})");
            return self.push(call, x.cross_entropy_weighted(&target, &weight, options));
        }
        self.push(format!("{name}.cross_entropy(&{text}, {options:?})"), x.cross_entropy(&target, options))
    }

    /// `scaled_dot_product_attention` with `x` as the queries `[..., L, E]`.
    fn attention(&mut self, name: String, x: Tensor) -> Result<()> {
        let rank = x.rank().max(2);
        let q_shape: Vec<usize> = if x.rank() >= 2 { x.shape().to_vec() } else { vec![1; rank] };
        let (batch, e) = (&q_shape[..rank - 2], q_shape[rank - 1]);
        let (s, ev) = (self.size(), self.size());
        let kv = |last: usize| [batch, &[s, last]].concat();
        let dtype = if self.wild() { self.dtype() } else { x.dtype() };
        let (kt, k) = self.data(dtype, &kv(e))?;
        let (vt, v) = self.data(dtype, &kv(ev))?;
        let causal = self.rng.chance(40);
        let mask = if self.rng.chance(30) {
            let l = q_shape[rank - 2];
            Some(self.data(DType::Bool, &[l, s])?)
        } else {
            None
        };
        let scale = self.rng.pick(&[None, Some(0.5)]);
        let mt = mask.as_ref().map_or("None".to_string(), |(t, _)| format!("Some(&{t})"));
        let call = format!("coil::scaled_dot_product_attention(&{name}, &{kt}, &{vt}, {mt}, {causal}, {scale:?})");
        let mask = mask.map(|m| m.1);
        self.push(call, coil::scaled_dot_product_attention(&x, &k, &v, mask.as_ref(), causal, scale))
    }

    pub fn linalg(&mut self) -> Result<()> {
        let (name, x) = self.operand();
        let k = x.shape().last().copied().unwrap_or(1);
        let dtype = if self.wild() { self.dtype() } else { x.dtype() };
        let n = self.size();
        match self.rng.below(4) {
            0 => {
                let batch = if x.rank() > 2 { self.broadcastable(&x.shape()[..x.rank() - 2]) } else { vec![] };
                let shape = match self.rng.below(3) {
                    0 => vec![k],
                    1 => vec![k, n],
                    _ => [batch, vec![k, n]].concat(),
                };
                let (text, y) = self.data(dtype, &shape)?;
                self.push(format!("{name}.matmul(&{text})"), x.matmul(&y))
            }
            1 => {
                let (text, y) = self.data(dtype, &[k, n])?;
                self.push(format!("{name}.mm(&{text})"), x.mm(&y))
            }
            2 => {
                let b = x.shape().first().copied().unwrap_or(1);
                let (text, y) = self.data(dtype, &[b, k, n])?;
                self.push(format!("{name}.bmm(&{text})"), x.bmm(&y))
            }
            _ => {
                let (wt, w) = self.data(dtype, &[n, k])?;
                if self.rng.chance(50) {
                    return self.push(format!("{name}.linear(&{wt}, None)"), x.linear(&w, None));
                }
                let len = if self.wild() { n + 1 } else { n };
                let (bt, b) = self.data(dtype, &[len])?;
                self.push(format!("{name}.linear(&{wt}, Some(&{bt}))"), x.linear(&w, Some(&b)))
            }
        }
    }

    /// A new tensor from a creation function (with sizes that overflow when wild).
    pub fn creation(&mut self) -> Result<()> {
        let mut shape = self.shape();
        if self.wild() {
            shape.push(self.huge_size());
            shape.push(2);
        }
        let dtype = self.dtype();
        match self.rng.below(9) {
            0 => {
                let v = self.rng.pick(&[0.0, -0.0, 2.5, f64::NAN, 1e300]);
                self.push(
                    format!("Ok(Tensor::full(&{shape:?}, {v:?}, DType::{dtype:?}))"),
                    Ok(Tensor::full(&shape, v, dtype)),
                )
            }
            1 => {
                let (name, x) = self.operand();
                self.push(format!("Ok({name}.ones_like())"), Ok(x.ones_like()))
            }
            2 => {
                let (start, end) = (self.rng.range(-3, 3), self.rng.range(-3, 9));
                let step = if self.wild() { 0 } else { self.rng.pick(&[1, 2, -1]) };
                self.push(
                    format!("Tensor::arange({start}, {end}, {step}, DType::{dtype:?})"),
                    Tensor::arange(start, end, step, dtype),
                )
            }
            3 => {
                let (start, end) = (self.rng.range(-3, 3) as f64, self.rng.range(-3, 9) as f64 / 2.0);
                let steps = if self.wild() { self.huge_size() } else { self.size() };
                let call = format!("Tensor::linspace({start:?}, {end:?}, {steps}, DType::{dtype:?})");
                self.push(call, Tensor::linspace(start, end, steps, dtype))
            }
            4 => {
                let (n, m) = (self.size(), if self.wild() { Some(self.huge_size()) } else { Some(self.size()) });
                self.push(format!("Tensor::eye({n}, {m:?}, DType::{dtype:?})"), Tensor::eye(n, m, dtype))
            }
            5 => {
                if self.rng.chance(50) {
                    self.push(format!("Tensor::rand(&{shape:?}, DType::{dtype:?})"), Tensor::rand(&shape, dtype))
                } else {
                    self.push(format!("Tensor::randn(&{shape:?}, DType::{dtype:?})"), Tensor::randn(&shape, dtype))
                }
            }
            6 => {
                let d = self.rng.below(shape.len() + 1);
                self.push(format!("Tensor::iota(&{shape:?}, {d})"), Tensor::iota(&shape, d))
            }
            7 => {
                let device = self.device();
                self.push("Ok(Tensor::scalar(-0.0f32))".into(), Tensor::scalar(-0.0f32).to_device(device))
            }
            _ => {
                // Data that does not fill its shape (a shape whose product wraps, when wild).
                let n = shape.iter().fold(1usize, |a, &s| a.wrapping_mul(s));
                let len = if self.rng.chance(50) { n.wrapping_add(1) % 64 } else { n % 64 };
                let call = format!("Tensor::from_vec(vec![1.0f32; {len}], &{shape:?})");
                let device = self.device();
                self.push(call, Tensor::from_vec(vec![1.0f32; len], &shape).and_then(|t| t.to_device(device)))
            }
        }
    }
}
