//! Shape and dtype inference for every [`Op`], following PyTorch's rules.
//!
//! The frontend calls [`infer`] when it records an op, and the graph builder calls it for every
//! node the decompositions create, so a shape or dtype error is caught once, at the user's line.
//!
//! ```
//! use coil_ir::{infer::{infer, Operand}, Op, BinaryOp, TensorMeta, DType};
//! let a = TensorMeta::new(vec![4, 1], DType::I32);
//! let b = TensorMeta::new(vec![3], DType::F16);
//! let out = infer(&Op::Binary(BinaryOp::Mul), &[Operand::tensor(&a), Operand::tensor(&b)]).unwrap();
//! assert_eq!(out, TensorMeta::new(vec![4, 3], DType::F16));
//! ```

use crate::dtype::{self, result_type, DType};
use crate::error::{Error, Result};
use crate::graph::{check_shape, numel, Shape, TensorMeta};
use crate::op::{BinaryOp, LossReduction, Op, ReduceOp, UnaryOp};

/// An operand as type promotion sees it: its meta, and whether it is a Rust scalar.
#[derive(Clone, Copy, Debug)]
pub struct Operand<'a> {
    /// The operand's shape and dtype.
    pub meta: &'a TensorMeta,
    /// A Rust scalar ([`Op::Scalar`]): weak in promotion.
    pub scalar: bool,
}

impl<'a> Operand<'a> {
    /// A tensor operand (not a Rust scalar).
    pub fn tensor(meta: &'a TensorMeta) -> Operand<'a> {
        Operand { meta, scalar: false }
    }

    fn promotion(self) -> dtype::Operand {
        if self.scalar {
            dtype::Operand::Scalar(self.meta.dtype)
        } else if self.meta.shape.is_empty() {
            dtype::Operand::ZeroDim(self.meta.dtype)
        } else {
            dtype::Operand::Dimensioned(self.meta.dtype)
        }
    }
}

/// PyTorch's broadcasting: align from the right; a dim of 1 stretches.
///
/// ```
/// use coil_ir::infer::broadcast_shapes;
/// assert_eq!(broadcast_shapes(&[2, 1, 4], &[3, 1]).unwrap(), vec![2, 3, 4]);
/// assert!(broadcast_shapes(&[2, 3], &[4]).is_err());
/// ```
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Result<Shape> {
    let rank = a.len().max(b.len());
    let mut out = vec![0; rank];
    for i in 0..rank {
        let da = if i < rank - a.len() { 1 } else { a[i - (rank - a.len())] };
        let db = if i < rank - b.len() { 1 } else { b[i - (rank - b.len())] };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                return Err(Error::shape(format!(
                    "shapes {a:?} and {b:?} cannot be broadcast: the size {da} must match the size {db} at dim {i} of the result"
                )))
            }
        };
    }
    Ok(out)
}

/// The dtype the operands promote to (`torch.result_type`).
pub fn promote(operands: &[Operand]) -> DType {
    let ops: Vec<dtype::Operand> = operands.iter().map(|o| o.promotion()).collect();
    result_type(&ops)
}

/// Infers the meta of a non-leaf op applied to `inputs`. Errors carry no op name or location;
/// the caller adds them ([`Error::in_op`], [`Error::at`]). The result's shape is checked to be
/// one a tensor can have ([`crate::graph::check_shape`]).
pub fn infer(op: &Op, inputs: &[Operand]) -> Result<TensorMeta> {
    let meta = infer_unchecked(op, inputs)?;
    check_shape(&meta.shape)?;
    Ok(meta)
}

fn infer_unchecked(op: &Op, inputs: &[Operand]) -> Result<TensorMeta> {
    let arity = |n: usize| -> Result<()> {
        if inputs.len() == n {
            Ok(())
        } else {
            Err(Error::runtime(format!("expects {n} operands, got {}", inputs.len())))
        }
    };
    let x = inputs.first().map(|o| o.meta);
    let same = |m: &TensorMeta| Ok(m.clone());
    match op {
        Op::Input { .. } | Op::Scalar(_) | Op::Full(_) | Op::Iota { .. } | Op::Rand { .. } => {
            Err(Error::runtime(format!("{} is a leaf: its meta is given, not inferred", op.name())))
        }
        Op::Unary(u) => {
            arity(1)?;
            unary(*u, x.unwrap())
        }
        Op::Binary(b) => {
            arity(2)?;
            binary(*b, inputs[0], inputs[1])
        }
        Op::Where => {
            arity(3)?;
            if inputs[0].meta.dtype != DType::Bool {
                return Err(Error::dtype(format!("where expects a bool condition, got {}", inputs[0].meta.dtype)));
            }
            let shape = broadcast_shapes(
                &broadcast_shapes(&inputs[0].meta.shape, &inputs[1].meta.shape)?,
                &inputs[2].meta.shape,
            )?;
            Ok(TensorMeta::new(shape, promote(&inputs[1..])))
        }
        Op::Cast(t) => {
            arity(1)?;
            Ok(TensorMeta::new(x.unwrap().shape.clone(), *t))
        }
        Op::Reduce { op, dims, keepdim } => {
            arity(1)?;
            let x = x.unwrap();
            check_dims(dims, x.rank())?;
            if op.is_arg() && dims.len() > 1 {
                return Err(Error::shape(format!("{} reduces one dim, got {dims:?}", op.name())));
            }
            if matches!(op, ReduceOp::Max | ReduceOp::Min | ReduceOp::ArgMax | ReduceOp::ArgMin)
                && dims.iter().any(|&d| x.shape[d] == 0)
            {
                return Err(Error::value(format!("{} of an empty dim: the reduction has no identity", op.name())));
            }
            let dtype = match op {
                ReduceOp::Sum | ReduceOp::Prod if x.dtype.is_integral() => DType::I64,
                ReduceOp::ArgMax | ReduceOp::ArgMin => DType::I64,
                _ => x.dtype,
            };
            Ok(TensorMeta::new(reduced_shape(&x.shape, dims, *keepdim), dtype))
        }
        Op::Cumsum { dim } => {
            arity(1)?;
            let x = x.unwrap();
            check_dims(&[*dim], x.rank().max(1))?;
            let dtype = if x.dtype.is_integral() { DType::I64 } else { x.dtype };
            Ok(TensorMeta::new(x.shape.clone(), dtype))
        }
        Op::Argsort { dim, .. } => {
            arity(1)?;
            let x = x.unwrap();
            check_dims(&[*dim], x.rank().max(1))?;
            Ok(TensorMeta::new(x.shape.clone(), DType::I64))
        }
        Op::Reshape { shape } => {
            arity(1)?;
            let x = x.unwrap();
            check_shape(shape)?;
            if numel(shape) != x.numel() {
                return Err(Error::shape(format!(
                    "shape {shape:?} is invalid for input of size {} (shape {:?})",
                    x.numel(),
                    x.shape
                )));
            }
            Ok(TensorMeta::new(shape.clone(), x.dtype))
        }
        Op::Permute { perm } => {
            arity(1)?;
            let x = x.unwrap();
            let mut seen = vec![false; x.rank()];
            if perm.len() != x.rank() || perm.iter().any(|&p| p >= x.rank() || std::mem::replace(&mut seen[p], true)) {
                return Err(Error::shape(format!(
                    "{perm:?} is not a permutation of the {} dims of {:?}",
                    x.rank(),
                    x.shape
                )));
            }
            Ok(TensorMeta::new(perm.iter().map(|&p| x.shape[p]).collect::<Shape>(), x.dtype))
        }
        Op::Expand { shape } => {
            arity(1)?;
            let x = x.unwrap();
            if shape.len() < x.rank() {
                return Err(Error::shape(format!("cannot expand {:?} to fewer dims {shape:?}", x.shape)));
            }
            let lead = shape.len() - x.rank();
            for (i, &d) in x.shape.iter().enumerate() {
                if d != 1 && d != shape[lead + i] {
                    return Err(Error::shape(format!(
                        "the expanded size {} must match the existing size {d} at non-singleton dim {i}; target {shape:?}, input {:?}",
                        shape[lead + i],
                        x.shape
                    )));
                }
            }
            Ok(TensorMeta::new(shape.clone(), x.dtype))
        }
        Op::Slice { dim, start, len, step } => {
            arity(1)?;
            let x = x.unwrap();
            check_dims(&[*dim], x.rank())?;
            let size = x.shape[*dim] as i64;
            if *step == 0 {
                return Err(Error::value("slice step cannot be zero"));
            }
            if *len > 0 {
                // In i128: a length or step from the user may be anything.
                let last = *start as i128 + (*len as i128 - 1) * *step as i128;
                if *start as i128 >= size as i128 || last < 0 || last >= size as i128 {
                    return Err(Error::value(format!(
                        "slice start={start} len={len} step={step} is out of bounds for dim {dim} of size {size}"
                    )));
                }
            }
            let mut shape = x.shape.clone();
            shape[*dim] = *len;
            Ok(TensorMeta::new(shape, x.dtype))
        }
        Op::Pad { pads, .. } => {
            arity(1)?;
            let x = x.unwrap();
            if pads.len() != x.rank() {
                return Err(Error::shape(format!(
                    "pad gives {} (before, after) pairs for a rank-{} tensor",
                    pads.len(),
                    x.rank()
                )));
            }
            let padded = |(d, (b, a)): (&usize, &(usize, usize))| d.checked_add(*b)?.checked_add(*a);
            let shape = x.shape.iter().zip(pads).map(padded).collect::<Option<Shape>>();
            let shape =
                shape.ok_or_else(|| Error::shape(format!("padding {pads:?} overflows the size of {:?}", x.shape)))?;
            Ok(TensorMeta::new(shape, x.dtype))
        }
        Op::Cat { dim } => {
            let first = x.ok_or_else(|| Error::value("cat expects a non-empty list of tensors"))?;
            check_dims(&[*dim], first.rank())?;
            let mut shape = first.shape.clone();
            shape[*dim] = 0;
            for (k, o) in inputs.iter().enumerate() {
                let m = o.meta;
                let fits = m.rank() == first.rank() && (0..m.rank()).all(|d| d == *dim || m.shape[d] == first.shape[d]);
                if !fits {
                    return Err(Error::shape(format!(
                        "sizes of tensors must match except in dim {dim}: tensor 0 has shape {:?}, tensor {k} has {:?}",
                        first.shape, m.shape
                    )));
                }
                shape[*dim] = shape[*dim]
                    .checked_add(m.shape[*dim])
                    .ok_or_else(|| Error::shape(format!("the concatenated size along dim {dim} overflows")))?;
            }
            Ok(TensorMeta::new(shape, promote(inputs)))
        }
        Op::Gather { dim } => {
            arity(2)?;
            let (x, index) = (inputs[0].meta, inputs[1].meta);
            check_index_dtype(index)?;
            check_dims(&[*dim], x.rank().max(1))?;
            if index.rank() != x.rank() {
                return Err(Error::shape(format!(
                    "index {:?} and input {:?} must have the same number of dims",
                    index.shape, x.shape
                )));
            }
            if (0..x.rank()).any(|d| d != *dim && index.shape[d] > x.shape[d]) {
                return Err(Error::shape(format!(
                    "index {:?} is larger than input {:?} outside dim {dim}",
                    index.shape, x.shape
                )));
            }
            Ok(TensorMeta::new(index.shape.clone(), x.dtype))
        }
        Op::IndexSelect { dim } => {
            arity(2)?;
            let (x, index) = (inputs[0].meta, inputs[1].meta);
            check_index_dtype(index)?;
            check_dims(&[*dim], x.rank().max(1))?;
            if index.rank() > 1 {
                return Err(Error::shape(format!("index_select expects a 1-D index, got {:?}", index.shape)));
            }
            if x.rank() == 0 && index.numel() != 1 {
                // A 0-d input has one element to select: PyTorch refuses any other count.
                return Err(Error::shape(format!(
                    "index to a 0-d tensor can have only 1 value, got {} value(s)",
                    index.numel()
                )));
            }
            let mut shape = x.shape.clone();
            if !shape.is_empty() {
                shape[*dim] = index.numel();
            }
            Ok(TensorMeta::new(shape, x.dtype))
        }
        Op::Scatter { dim, reduce } => {
            arity(3)?;
            if reduce.is_some_and(ReduceOp::is_arg) {
                return Err(Error::unsupported("scatter reduces with sum, prod, amax or amin"));
            }
            let (x, index, src) = (inputs[0].meta, inputs[1].meta, inputs[2].meta);
            check_index_dtype(index)?;
            check_dims(&[*dim], x.rank().max(1))?;
            if x.dtype != src.dtype {
                return Err(Error::dtype(format!(
                    "scatter expects src of the input's dtype {}, got {}",
                    x.dtype, src.dtype
                )));
            }
            if index.rank() != x.rank() || src.rank() != x.rank() {
                return Err(Error::shape("index, input and src must have the same number of dims"));
            }
            if (0..x.rank()).any(|d| index.shape[d] > src.shape[d] || (d != *dim && index.shape[d] > x.shape[d])) {
                return Err(Error::shape(format!(
                    "index {:?} must be no larger than src {:?}, and than input {:?} outside dim {dim}",
                    index.shape, src.shape, x.shape
                )));
            }
            Ok(x.clone())
        }
        Op::Bmm => {
            arity(2)?;
            let (a, b) = (inputs[0].meta, inputs[1].meta);
            check_matmul_dtypes(a, b)?;
            if a.rank() < 2 || a.rank() != b.rank() || a.shape[..a.rank() - 2] != b.shape[..b.rank() - 2] {
                return Err(Error::shape(format!(
                    "bmm expects operands [..., m, k] and [..., k, n] with equal batch dims, got {:?} and {:?}",
                    a.shape, b.shape
                )));
            }
            let (m, k) = (a.shape[a.rank() - 2], a.shape[a.rank() - 1]);
            let (k2, n) = (b.shape[b.rank() - 2], b.shape[b.rank() - 1]);
            if k != k2 {
                return Err(Error::shape(format!(
                    "contracted dims differ ({k} vs {k2}): {:?} @ {:?}",
                    a.shape, b.shape
                )));
            }
            let mut shape = a.shape[..a.rank() - 2].to_vec();
            shape.extend([m, n]);
            Ok(TensorMeta::new(shape, a.dtype))
        }
        Op::Matmul => {
            arity(2)?;
            let (a, b) = (inputs[0].meta, inputs[1].meta);
            check_matmul_dtypes(a, b)?;
            Ok(TensorMeta::new(matmul_shape(&a.shape, &b.shape)?, a.dtype))
        }
        Op::Linear { bias } => {
            arity(if *bias { 3 } else { 2 })?;
            let (x, w) = (inputs[0].meta, inputs[1].meta);
            check_matmul_dtypes(x, w)?;
            if x.rank() < 1 || w.rank() != 2 || x.shape[x.rank() - 1] != w.shape[1] {
                return Err(Error::shape(format!(
                    "linear expects x [..., in] and weight [out, in], got {:?} and {:?}",
                    x.shape, w.shape
                )));
            }
            let mut shape = x.shape[..x.rank() - 1].to_vec();
            shape.push(w.shape[0]);
            if *bias {
                let b = inputs[2].meta;
                check_matmul_dtypes(x, b)?;
                // The bias is expanded to the output (PyTorch adds it in place).
                if broadcast_shapes(&shape, &b.shape)? != shape {
                    return Err(Error::shape(format!(
                        "the bias {:?} does not expand to the output {shape:?}",
                        b.shape
                    )));
                }
            }
            Ok(TensorMeta::new(shape, x.dtype))
        }
        Op::Relu if x.unwrap().dtype == DType::Bool => Err(Error::dtype("relu is not supported on bool tensors")),
        Op::Relu | Op::Detach => same(x.unwrap()),
        Op::Gelu { .. } | Op::Silu | Op::Softplus { .. } | Op::Dropout { .. } => {
            let x = float_input(x.unwrap(), op)?;
            if let Op::Dropout { p, .. } = op {
                if !(0.0..=1.0).contains(p) {
                    return Err(Error::value(format!("dropout probability has to be between 0 and 1, but got {p}")));
                }
            }
            same(x)
        }
        Op::Clamp { .. } => {
            // The bounds take part in promotion as scalars; the frontend passes them as operands.
            let x = x.unwrap();
            Ok(TensorMeta::new(x.shape.clone(), promote(inputs)))
        }
        Op::NanToNum { .. } => same(x.unwrap()),
        Op::Mean { dims, keepdim } | Op::Var { dims, keepdim, .. } | Op::Std { dims, keepdim, .. } => {
            arity(1)?;
            let x = float_input(x.unwrap(), op)?;
            check_dims(dims, x.rank())?;
            Ok(TensorMeta::new(reduced_shape(&x.shape, dims, *keepdim), x.dtype))
        }
        Op::Norm { dims, keepdim, .. } => {
            arity(1)?;
            let x = float_input(x.unwrap(), op)?;
            check_dims(dims, x.rank())?;
            Ok(TensorMeta::new(reduced_shape(&x.shape, dims, *keepdim), x.dtype))
        }
        Op::LogSumExp { dims, keepdim } => {
            arity(1)?;
            let x = x.unwrap();
            check_dims(dims, x.rank())?;
            Ok(TensorMeta::new(reduced_shape(&x.shape, dims, *keepdim), x.dtype.to_float()))
        }
        Op::Any { dims, keepdim } | Op::All { dims, keepdim } => {
            arity(1)?;
            let x = x.unwrap();
            check_dims(dims, x.rank())?;
            Ok(TensorMeta::new(reduced_shape(&x.shape, dims, *keepdim), DType::Bool))
        }
        Op::Softmax { dim } | Op::LogSoftmax { dim } => {
            arity(1)?;
            let x = float_input(x.unwrap(), op)?;
            check_dims(&[*dim], x.rank().max(1))?;
            same(x)
        }
        Op::LayerNorm { ndim, weight, bias, .. } => {
            arity(1 + *weight as usize + *bias as usize)?;
            let x = float_input(x.unwrap(), op)?;
            normalized_params(x, *ndim, &inputs[1..])?;
            same(x)
        }
        Op::RmsNorm { ndim, weight, .. } => {
            arity(1 + *weight as usize)?;
            let x = float_input(x.unwrap(), op)?;
            normalized_params(x, *ndim, &inputs[1..])?;
            same(x)
        }
        Op::Tril { .. } | Op::Triu { .. } => {
            arity(1)?;
            let x = x.unwrap();
            if x.rank() < 2 {
                return Err(Error::shape(format!(
                    "{} expects a tensor with 2 or more dims, got {:?}",
                    op.name(),
                    x.shape
                )));
            }
            same(x)
        }
        Op::Embedding => {
            arity(2)?;
            let (w, idx) = (inputs[0].meta, inputs[1].meta);
            check_index_dtype(idx)?;
            if w.rank() != 2 {
                return Err(Error::shape(format!("embedding weight must be 2-D, got {:?}", w.shape)));
            }
            let mut shape = idx.shape.clone();
            shape.push(w.shape[1]);
            Ok(TensorMeta::new(shape, w.dtype))
        }
        Op::CrossEntropy { reduction, label_smoothing, weight, .. } => {
            arity(2 + *weight as usize)?;
            let (logits, target) = (float_input(inputs[0].meta, op)?, inputs[1].meta);
            if logits.rank() == 0 {
                return Err(Error::shape("cross_entropy expects logits [N, C] or [C], got a 0-d tensor"));
            }
            if *weight {
                let (w, classes) = (inputs[2].meta, logits.shape[logits.rank() - 1]);
                if w.shape != [classes] || w.dtype != logits.dtype {
                    return Err(Error::shape(format!(
                        "weight must be a {} tensor of shape [{classes}] (one per class), got {w}",
                        logits.dtype
                    )));
                }
            }
            check_index_dtype(target)?;
            let batch: Shape = match logits.rank() {
                1 => vec![],
                2 => vec![logits.shape[0]],
                _ => {
                    return Err(Error::unsupported(format!(
                        "cross_entropy over logits {:?}: use [N, C] or [C]",
                        logits.shape
                    )))
                }
            };
            if target.shape != batch {
                return Err(Error::shape(format!(
                    "expected target of shape {batch:?} for logits {:?}, got {:?}",
                    logits.shape, target.shape
                )));
            }
            if !(0.0..=1.0).contains(label_smoothing) {
                return Err(Error::value(format!(
                    "label_smoothing must be between 0.0 and 1.0, got {label_smoothing}"
                )));
            }
            let shape = if *reduction == LossReduction::None { batch } else { vec![] };
            Ok(TensorMeta::new(shape, logits.dtype))
        }
        Op::MseLoss { reduction } => {
            arity(2)?;
            let shape = broadcast_shapes(&inputs[0].meta.shape, &inputs[1].meta.shape)?;
            let dtype = promote(inputs);
            if !dtype.is_float() {
                return Err(Error::dtype(format!("mse_loss expects floating inputs, got {dtype}")));
            }
            let shape = if *reduction == LossReduction::None { shape } else { vec![] };
            Ok(TensorMeta::new(shape, dtype))
        }
        Op::Attention { mask, dropout, .. } => {
            arity(3 + *mask as usize)?;
            check_attention_dropout(dropout)?;
            let (q, v) = (inputs[0].meta, inputs[2].meta);
            let batch = attention_batch(op, inputs)?;
            let r = q.rank();
            if *mask {
                attention_mask(inputs, &batch, inputs[3].meta)?;
            }
            let mut shape = batch;
            shape.extend([q.shape[r - 2], v.shape[r - 1]]);
            Ok(TensorMeta::new(shape, q.dtype))
        }
        Op::AttentionLogsumexp { mask, .. } => {
            arity(3 + *mask as usize)?;
            let q = inputs[0].meta;
            let mut shape = attention_batch(op, inputs)?;
            if *mask {
                attention_mask(inputs, &shape, inputs[3].meta)?;
            }
            shape.push(q.shape[q.rank() - 2]);
            Ok(TensorMeta::new(shape, attention_stats_dtype(q.dtype)))
        }
        Op::AttentionBackward { input, mask, dropout, .. } => {
            arity(6 + *mask as usize)?;
            check_attention_dropout(dropout)?;
            let (q, v) = (inputs[0].meta, inputs[2].meta);
            let batch = attention_batch(op, inputs)?;
            if *mask {
                attention_mask(inputs, &batch, inputs[6].meta)?;
            }
            let r = q.rank();
            if (0..3).any(|i| inputs[i].meta.shape[..r - 2] != batch[..]) {
                return Err(Error::shape(format!(
                    "the attention backward expects q, k and v of equal batch dims, got {:?}, {:?}, {:?}",
                    q.shape, inputs[1].meta.shape, v.shape
                )));
            }
            let out = TensorMeta::new([&batch[..], &[q.shape[r - 2], v.shape[r - 1]]].concat(), q.dtype);
            let stats = TensorMeta::new([&batch[..], &[q.shape[r - 2]]].concat(), attention_stats_dtype(q.dtype));
            for (k, want, what) in
                [(3, &out, "the output gradient"), (4, &stats, "the logsumexp"), (5, &out, "the output")]
            {
                if inputs[k].meta != want {
                    return Err(Error::shape(format!("{what} must be {want}, got {}", inputs[k].meta)));
                }
            }
            Ok(inputs[input.index()].meta.clone())
        }
        Op::Conv { geometry, form } => {
            arity(2)?;
            crate::op::infer_conv(geometry, form, inputs[0].meta, inputs[1].meta)
        }
    }
}

/// The dtype of attention's row statistics (the logsumexp, the backward's delta): f32, or f64
/// for f64 operands.
pub fn attention_stats_dtype(dtype: DType) -> DType {
    if dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// Checks an attention mask `m` against the operands (q, k first) of attention whose broadcast
/// batch dims are `batch`: it broadcasts to the scores `[*batch, L, S]` and is bool or of q's
/// dtype.
fn attention_mask(inputs: &[Operand], batch: &[usize], m: &TensorMeta) -> Result<()> {
    let q = inputs[0].meta;
    let r = q.rank();
    let mut scores = batch.to_vec();
    scores.extend([q.shape[r - 2], inputs[1].meta.shape[r - 2]]);
    if broadcast_shapes(&scores, &m.shape)? != scores {
        return Err(Error::shape(format!("attention mask {:?} does not broadcast to the scores {scores:?}", m.shape)));
    }
    if m.dtype != DType::Bool && m.dtype != q.dtype {
        return Err(Error::dtype(format!("attention mask must be bool or {}, got {}", q.dtype, m.dtype)));
    }
    Ok(())
}

/// Attention's dropout probability is in `[0, 1)` (a graph holds it only when positive): 1
/// would scale the kept weights by infinity, and PyTorch's SDPA refuses it too.
fn check_attention_dropout(dropout: &Option<crate::op::AttentionDropout>) -> Result<()> {
    match dropout {
        Some(d) if !(0.0..1.0).contains(&d.p) => {
            Err(Error::value(format!("attention dropout probability has to be in [0, 1), but got {}", d.p)))
        }
        _ => Ok(()),
    }
}

/// Checks attention's operands q `[..., L, E]`, k `[..., S, E]`, v `[..., S, Ev]` (floating,
/// one dtype) and returns their broadcast batch dims.
fn attention_batch(op: &Op, inputs: &[Operand]) -> Result<Shape> {
    let (q, k, v) = (inputs[0].meta, inputs[1].meta, inputs[2].meta);
    let q = float_input(q, op)?;
    if q.dtype != k.dtype || q.dtype != v.dtype {
        return Err(Error::dtype(format!(
            "query, key and value must share a dtype, got {}, {}, {}",
            q.dtype, k.dtype, v.dtype
        )));
    }
    let r = q.rank();
    if r < 2 || k.rank() != r || v.rank() != r || q.shape[r - 1] != k.shape[r - 1] || k.shape[r - 2] != v.shape[r - 2] {
        return Err(Error::shape(format!(
            "attention expects q [..., L, E], k [..., S, E], v [..., S, Ev]; got {:?}, {:?}, {:?}",
            q.shape, k.shape, v.shape
        )));
    }
    broadcast_shapes(&broadcast_shapes(&q.shape[..r - 2], &k.shape[..r - 2])?, &v.shape[..r - 2])
}

fn unary(u: UnaryOp, x: &TensorMeta) -> Result<TensorMeta> {
    let dtype = if u.returns_bool() {
        DType::Bool
    } else if u.float_only() {
        x.dtype.to_float()
    } else if u.integral_only() && x.dtype.is_float() {
        // As PyTorch, which has no kernel of bit ops for floats.
        return Err(Error::dtype(format!(
            "{} is not supported on {} tensors, only integers and bool",
            u.name(),
            x.dtype
        )));
    } else if u == UnaryOp::Neg && x.dtype == DType::Bool {
        return Err(Error::dtype("negation, the `-` operator, on a bool tensor is not supported; use logical_not"));
    } else if x.dtype == DType::Bool
        && matches!(u, UnaryOp::Abs | UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round | UnaryOp::Trunc)
    {
        // As PyTorch, which has no kernel of these for bool.
        return Err(Error::dtype(format!("{} is not supported on bool tensors", u.name())));
    } else {
        x.dtype
    };
    Ok(TensorMeta::new(x.shape.clone(), dtype))
}

fn binary(b: BinaryOp, x: Operand, y: Operand) -> Result<TensorMeta> {
    let shape = broadcast_shapes(&x.meta.shape, &y.meta.shape)?;
    let common = promote(&[x, y]);
    let dtype = match b {
        _ if b.returns_bool() => DType::Bool,
        _ if b.float_only() => common.to_float(),
        _ if b.integral_only() && common.is_float() => {
            return Err(Error::dtype(format!(
                "{} is not supported on {common} operands, only integers and bool",
                b.name()
            )))
        }
        BinaryOp::ShiftLeft | BinaryOp::ShiftRight if common == DType::Bool => {
            return Err(Error::dtype(format!("{} of two bool operands is not supported", b.name())))
        }
        BinaryOp::FloorDiv | BinaryOp::TruncDiv | BinaryOp::Remainder if common == DType::Bool => {
            return Err(Error::dtype(format!("{} of two bool operands is not supported", b.name())))
        }
        BinaryOp::Sub if x.meta.dtype == DType::Bool && y.meta.dtype == DType::Bool => {
            return Err(Error::dtype(
                "subtraction, the `-` operator, with two bool tensors is not supported; use logical_xor",
            ))
        }
        _ => common,
    };
    Ok(TensorMeta::new(shape, dtype))
}

/// Dims must be in range and distinct (the frontend has already wrapped negative dims).
pub fn check_dims(dims: &[usize], rank: usize) -> Result<()> {
    for (i, &d) in dims.iter().enumerate() {
        if d >= rank {
            return Err(Error::shape(format!("dim {d} is out of range for a tensor of rank {rank}")));
        }
        if dims[..i].contains(&d) {
            return Err(Error::shape(format!("dim {d} appears more than once in {dims:?}")));
        }
    }
    Ok(())
}

/// The shape after reducing `dims`.
pub fn reduced_shape(shape: &[usize], dims: &[usize], keepdim: bool) -> Shape {
    (0..shape.len())
        .filter_map(|d| match (dims.contains(&d), keepdim) {
            (false, _) => Some(shape[d]),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect()
}

/// `torch.matmul`'s result shape: 1-D operands gain and then lose a dim; batch dims broadcast.
pub fn matmul_shape(a: &[usize], b: &[usize]) -> Result<Shape> {
    if a.is_empty() || b.is_empty() {
        return Err(Error::shape(format!("both arguments to matmul need at least 1 dim, got {a:?} and {b:?}")));
    }
    let (ka, kb) = (a[a.len() - 1], if b.len() == 1 { b[0] } else { b[b.len() - 2] });
    if ka != kb {
        return Err(Error::shape(format!("contracted dims differ ({ka} vs {kb}): {a:?} @ {b:?}")));
    }
    let batch = broadcast_shapes(&a[..a.len().saturating_sub(2)], &b[..b.len().saturating_sub(2)])?;
    let mut out = batch;
    if a.len() >= 2 {
        out.push(a[a.len() - 2]);
    }
    if b.len() >= 2 {
        out.push(b[b.len() - 1]);
    }
    Ok(out)
}

fn check_index_dtype(index: &TensorMeta) -> Result<()> {
    match index.dtype {
        DType::I64 | DType::I32 => Ok(()),
        t => Err(Error::dtype(format!("indices must be i64 or i32, got {t}"))),
    }
}

fn check_matmul_dtypes(a: &TensorMeta, b: &TensorMeta) -> Result<()> {
    if a.dtype != b.dtype {
        return Err(Error::dtype(format!(
            "expected both operands to have the same dtype, got {} and {}",
            a.dtype, b.dtype
        )));
    }
    if a.dtype == DType::Bool {
        return Err(Error::dtype("matrix products of bool tensors are not supported"));
    }
    Ok(())
}

fn float_input<'a>(x: &'a TensorMeta, op: &Op) -> Result<&'a TensorMeta> {
    if x.dtype.is_float() {
        Ok(x)
    } else {
        Err(Error::dtype(format!("{} expects a floating tensor, got {}", op.name(), x.dtype)))
    }
}

/// Weight and bias of a normalization must have the normalized shape.
fn normalized_params(x: &TensorMeta, ndim: usize, params: &[Operand]) -> Result<()> {
    if ndim == 0 || ndim > x.rank() {
        return Err(Error::shape(format!("cannot normalize over the last {ndim} dims of {:?}", x.shape)));
    }
    let normalized = &x.shape[x.rank() - ndim..];
    for p in params {
        if p.meta.shape != normalized {
            return Err(Error::shape(format!(
                "weight and bias must have the normalized shape {normalized:?}, got {:?}",
                p.meta.shape
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(shape: &[usize], dtype: DType) -> TensorMeta {
        TensorMeta::new(shape.to_vec(), dtype)
    }

    #[test]
    fn matmul_shapes() {
        assert_eq!(matmul_shape(&[3], &[3]).unwrap(), Vec::<usize>::new());
        assert_eq!(matmul_shape(&[2, 1, 3, 4], &[5, 4, 2]).unwrap(), vec![2, 5, 3, 2]);
        assert_eq!(matmul_shape(&[4], &[2, 4, 3]).unwrap(), vec![2, 3]);
        assert!(matmul_shape(&[2, 3], &[4, 5]).is_err());
    }

    #[test]
    fn div_of_ints_is_float_and_sum_of_ints_is_i64() {
        let a = m(&[3], DType::I32);
        let d = infer(&Op::Binary(BinaryOp::Div), &[Operand::tensor(&a), Operand::tensor(&a)]).unwrap();
        assert_eq!(d.dtype, DType::F32);
        let s =
            infer(&Op::Reduce { op: ReduceOp::Sum, dims: vec![0], keepdim: false }, &[Operand::tensor(&a)]).unwrap();
        assert_eq!(s, m(&[], DType::I64));
    }

    #[test]
    fn scalar_operand_is_weak() {
        let a = m(&[3], DType::F16);
        let s = m(&[], DType::F32);
        let out =
            infer(&Op::Binary(BinaryOp::Mul), &[Operand::tensor(&a), Operand { meta: &s, scalar: true }]).unwrap();
        assert_eq!(out.dtype, DType::F16);
    }

    #[test]
    fn expand_and_slice_errors() {
        let a = m(&[2, 3], DType::F32);
        assert!(infer(&Op::Expand { shape: vec![4, 3] }, &[Operand::tensor(&a)]).is_err());
        assert!(infer(&Op::Expand { shape: vec![5, 2, 3] }, &[Operand::tensor(&a)]).is_ok());
        assert!(infer(&Op::Slice { dim: 1, start: 1, len: 2, step: 2 }, &[Operand::tensor(&a)]).is_err());
        assert!(infer(&Op::Slice { dim: 1, start: 2, len: 3, step: -1 }, &[Operand::tensor(&a)]).is_ok());
    }
}
