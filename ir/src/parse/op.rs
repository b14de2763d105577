//! An [`Op`] from its printed name and attributes: the inverse of [`Op::name`] and
//! [`Op::attributes`].

use super::{Attr, Located, Pos, Value};
use crate::dtype::{DType, Scalar};
use crate::op::{
    AttentionDropout, AttentionInput, BinaryOp, ConvForm, ConvGeometry, LossReduction, Op, RandDist, ReduceOp, UnaryOp,
};

/// The reductions, in the order of their printed names' lookup.
pub(super) const REDUCE_OPS: [ReduceOp; 6] =
    [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min, ReduceOp::ArgMax, ReduceOp::ArgMin];

/// The op printed as `name` with the attributes `attrs` (each with where it was written).
pub(super) fn build(name: &str, pos: Pos, attrs: Vec<Attr>) -> Result<Op, Located> {
    let mut a = Attrs { op: name, pos, items: attrs };
    let reduce_of = |n: &str| REDUCE_OPS.into_iter().find(|r| r.name() == n);
    let op = match name {
        "input" => {
            return Err((pos, "graph inputs are declared in the header, `graph(%0: f32[2], ...)`, not as nodes".into()))
        }
        "scalar" => Op::Scalar(a.scalar("value")?),
        "full" => Op::Full(a.scalar("value")?),
        "iota" => Op::Iota { dim: a.usize("dim")? },
        "rand" | "randn" => Op::Rand {
            dist: if name == "rand" { RandDist::Uniform } else { RandDist::Normal },
            stream: a.usize("stream")?,
            offset: a.int("offset")?,
        },
        "where" => Op::Where,
        "cast" => Op::Cast(a.dtype("dtype")?),
        _ if reduce_of(name).is_some() => {
            Op::Reduce { op: reduce_of(name).unwrap(), dims: a.usizes("dims")?, keepdim: a.bool("keepdim")? }
        }
        "cumsum" => Op::Cumsum { dim: a.usize("dim")? },
        "argsort" => Op::Argsort { dim: a.usize("dim")?, descending: a.bool("descending")? },
        "reshape" => Op::Reshape { shape: a.usizes("shape")? },
        "expand" => Op::Expand { shape: a.usizes("shape")? },
        "permute" => Op::Permute { perm: a.usizes("perm")? },
        "slice" => {
            Op::Slice { dim: a.usize("dim")?, start: a.usize("start")?, len: a.usize("len")?, step: a.int("step")? }
        }
        "pad" => Op::Pad { pads: a.pairs("pads")?, value: a.scalar("value")? },
        "cat" => Op::Cat { dim: a.usize("dim")? },
        "gather" => Op::Gather { dim: a.usize("dim")? },
        "index_select" => Op::IndexSelect { dim: a.usize("dim")? },
        "scatter" => Op::Scatter { dim: a.usize("dim")?, reduce: None },
        "scatter_add" | "scatter_prod" | "scatter_amax" | "scatter_amin" => {
            let reduce =
                if name == "scatter_add" { ReduceOp::Sum } else { reduce_of(&name["scatter_".len()..]).unwrap() };
            Op::Scatter { dim: a.usize("dim")?, reduce: Some(reduce) }
        }
        "bmm" => Op::Bmm,
        "matmul" => Op::Matmul,
        "linear" => Op::Linear { bias: a.bool("bias")? },
        "relu" => Op::Relu,
        "detach" => Op::Detach,
        "gelu" => Op::Gelu { tanh: a.choice("approximate", &["none", "tanh"])? == 1 },
        "silu" => Op::Silu,
        "softplus" => Op::Softplus { beta: a.float("beta")?, threshold: a.float("threshold")? },
        "clamp" => Op::Clamp { min: a.optional("min", Attrs::scalar)?, max: a.optional("max", Attrs::scalar)? },
        "nan_to_num" => Op::NanToNum {
            nan: a.float("nan")?,
            posinf: a.optional("posinf", Attrs::float)?,
            neginf: a.optional("neginf", Attrs::float)?,
        },
        "mean" => Op::Mean { dims: a.usizes("dims")?, keepdim: a.bool("keepdim")? },
        "logsumexp" => Op::LogSumExp { dims: a.usizes("dims")?, keepdim: a.bool("keepdim")? },
        "any" => Op::Any { dims: a.usizes("dims")?, keepdim: a.bool("keepdim")? },
        "all" => Op::All { dims: a.usizes("dims")?, keepdim: a.bool("keepdim")? },
        "var" => Op::Var { dims: a.usizes("dims")?, correction: a.float("correction")?, keepdim: a.bool("keepdim")? },
        "std" => Op::Std { dims: a.usizes("dims")?, correction: a.float("correction")?, keepdim: a.bool("keepdim")? },
        "norm" => Op::Norm { p: a.float("p")?, dims: a.usizes("dims")?, keepdim: a.bool("keepdim")? },
        "softmax" => Op::Softmax { dim: a.usize("dim")? },
        "log_softmax" => Op::LogSoftmax { dim: a.usize("dim")? },
        "layer_norm" => Op::LayerNorm {
            ndim: a.usize("ndim")?,
            eps: a.float("eps")?,
            weight: a.bool("weight")?,
            bias: a.bool("bias")?,
        },
        "rms_norm" => {
            Op::RmsNorm { ndim: a.usize("ndim")?, eps: a.optional("eps", Attrs::float)?, weight: a.bool("weight")? }
        }
        "tril" => Op::Tril { k: a.int("k")? },
        "triu" => Op::Triu { k: a.int("k")? },
        "dropout" => Op::Dropout { p: a.float("p")?, stream: a.usize("stream")?, offset: a.int("offset")? },
        "embedding" => Op::Embedding,
        "cross_entropy" => Op::CrossEntropy {
            ignore_index: a.int("ignore_index")?,
            reduction: a.reduction()?,
            label_smoothing: a.float("label_smoothing")?,
            weight: a.bool("weight")?,
        },
        "mse_loss" => Op::MseLoss { reduction: a.reduction()? },
        "scaled_dot_product_attention" => Op::Attention {
            causal: a.bool("causal")?,
            scale: a.optional("scale", Attrs::float)?,
            mask: a.bool("mask")?,
            dropout: a.dropout()?,
        },
        "attention_logsumexp" => Op::AttentionLogsumexp {
            causal: a.bool("causal")?,
            scale: a.optional("scale", Attrs::float)?,
            mask: a.bool("mask")?,
        },
        "attention_backward" => Op::AttentionBackward {
            causal: a.bool("causal")?,
            scale: a.optional("scale", Attrs::float)?,
            input: AttentionInput::ALL[a.choice("input", &AttentionInput::ALL.map(AttentionInput::name))?],
            mask: a.bool("mask")?,
            dropout: a.dropout()?,
        },
        "convolution" | "convolution_backward_data" | "convolution_backward_weight" => {
            let geometry = ConvGeometry {
                stride: a.usizes("stride")?,
                padding: a.usizes("padding")?,
                dilation: a.usizes("dilation")?,
                groups: a.usize("groups")?,
            };
            let form = match name {
                "convolution" => ConvForm::Forward,
                "convolution_backward_data" => ConvForm::BackwardData { size: a.usizes("size")? },
                _ => ConvForm::BackwardWeight { kernel: a.usizes("kernel")? },
            };
            Op::Conv { geometry, form }
        }
        _ => match (
            UnaryOp::ALL.into_iter().find(|u| u.name() == name),
            BinaryOp::ALL.into_iter().find(|b| b.name() == name),
        ) {
            (Some(u), _) => Op::Unary(u),
            (_, Some(b)) => Op::Binary(b),
            _ => return Err((pos, format!("unknown op `{name}`"))),
        },
    };
    a.finish()?;
    Ok(op)
}

/// The attributes of one node, taken out one by one as the op is built.
struct Attrs<'a> {
    op: &'a str,
    pos: Pos,
    items: Vec<Attr>,
}

impl Attrs<'_> {
    /// Takes the attribute `key` out; an error when it is missing.
    fn take(&mut self, key: &str) -> Result<(Value, Pos), Located> {
        match self.items.iter().position(|a| a.key == key) {
            Some(i) => {
                let a = self.items.remove(i);
                Ok((a.value, a.pos))
            }
            None => Err((self.pos, format!("`{}` needs the attribute `{key}=`", self.op))),
        }
    }

    /// An error for attribute `key` at `pos`, expecting `what`.
    fn bad(&self, key: &str, pos: Pos, what: &str, found: &Value) -> Located {
        (pos, format!("attribute `{key}` of `{}` must be {what}, found `{found}`", self.op))
    }

    fn usize(&mut self, key: &str) -> Result<usize, Located> {
        let (v, p) = self.take(key)?;
        usize_of(&v).ok_or_else(|| self.bad(key, p, "a non-negative integer", &v))
    }

    /// A signed or unsigned integer attribute (`i64`, `u64`).
    fn int<T: std::str::FromStr>(&mut self, key: &str) -> Result<T, Located> {
        let (v, p) = self.take(key)?;
        match &v {
            Value::Num(s) if is_integer(s) => s.parse().ok(),
            _ => None,
        }
        .ok_or_else(|| self.bad(key, p, "an integer in range", &v))
    }

    fn float(&mut self, key: &str) -> Result<f64, Located> {
        let (v, p) = self.take(key)?;
        match &v {
            Value::Num(s) => s.parse().ok(),
            _ => None,
        }
        .ok_or_else(|| self.bad(key, p, "a number", &v))
    }

    fn bool(&mut self, key: &str) -> Result<bool, Located> {
        Ok(self.choice(key, &["false", "true"])? == 1)
    }

    /// The index in `names` of the name the attribute holds.
    fn choice(&mut self, key: &str, names: &[&str]) -> Result<usize, Located> {
        let (v, p) = self.take(key)?;
        match &v {
            Value::Ident(s) => names.iter().position(|n| n == s),
            _ => None,
        }
        .ok_or_else(|| self.bad(key, p, &format!("one of {}", names.join(", ")), &v))
    }

    fn reduction(&mut self) -> Result<LossReduction, Located> {
        let all = [LossReduction::None, LossReduction::Mean, LossReduction::Sum];
        Ok(all[self.choice("reduction", &all.map(LossReduction::name))?])
    }

    fn dtype(&mut self, key: &str) -> Result<DType, Located> {
        let (v, p) = self.take(key)?;
        match &v {
            Value::Ident(s) => DType::parse(s),
            _ => None,
        }
        .ok_or_else(|| self.bad(key, p, "a dtype (f32, i64, bool, ...)", &v))
    }

    /// A scalar: `true` / `false`, an integer (`3`), or a float (`3.0`, `1e-5`, `-inf`, `nan`).
    fn scalar(&mut self, key: &str) -> Result<Scalar, Located> {
        let (v, p) = self.take(key)?;
        scalar_of(&v).ok_or_else(|| self.bad(key, p, "a scalar (a bool, an integer or a float)", &v))
    }

    /// Attention's dropout: `dropout_p=.., stream=.., offset=..` when `dropout_p` is given.
    fn dropout(&mut self) -> Result<Option<AttentionDropout>, Located> {
        if !self.items.iter().any(|a| a.key == "dropout_p") {
            return Ok(None);
        }
        Ok(Some(AttentionDropout {
            p: self.float("dropout_p")?,
            stream: self.usize("stream")?,
            offset: self.int("offset")?,
        }))
    }

    /// `none`, or the value `read` takes.
    fn optional<T>(
        &mut self,
        key: &str,
        read: fn(&mut Self, &str) -> Result<T, Located>,
    ) -> Result<Option<T>, Located> {
        match self.items.iter().find(|a| a.key == key).map(|a| &a.value) {
            Some(Value::Ident(s)) if s == "none" => {
                self.take(key)?;
                Ok(None)
            }
            _ => read(self, key).map(Some),
        }
    }

    /// A list of non-negative integers: `[0, 2]`.
    fn usizes(&mut self, key: &str) -> Result<Vec<usize>, Located> {
        let (v, p) = self.take(key)?;
        match &v {
            Value::List(items) => items.iter().map(|(x, _)| usize_of(x)).collect(),
            _ => None,
        }
        .ok_or_else(|| self.bad(key, p, "a list of non-negative integers", &v))
    }

    /// A list of pairs of non-negative integers: `[(1, 2), (0, 0)]`.
    fn pairs(&mut self, key: &str) -> Result<Vec<(usize, usize)>, Located> {
        let (v, p) = self.take(key)?;
        let pair = |x: &Value| match x {
            Value::Tuple(t) if t.len() == 2 => Some((usize_of(&t[0].0)?, usize_of(&t[1].0)?)),
            _ => None,
        };
        match &v {
            Value::List(items) => items.iter().map(|(x, _)| pair(x)).collect(),
            _ => None,
        }
        .ok_or_else(|| self.bad(key, p, "a list of pairs `(before, after)`", &v))
    }

    /// An error for the first attribute no field took.
    fn finish(self) -> Result<(), Located> {
        match self.items.first() {
            Some(a) => Err((a.key_pos, format!("`{}` has no attribute `{}`", self.op, a.key))),
            None => Ok(()),
        }
    }
}

/// A scalar value: `true` / `false`, an integer (`3`), or a float (`3.0`, `1e-5`, `-inf`, `nan`).
pub(super) fn scalar_of(v: &Value) -> Option<Scalar> {
    match v {
        Value::Ident(s) if s == "true" || s == "false" => Some(Scalar::Bool(s == "true")),
        Value::Num(s) if is_integer(s) => s.parse().ok().map(Scalar::Int),
        Value::Num(s) => s.parse().ok().map(Scalar::Float),
        _ => None,
    }
}

/// Whether a number is written as an integer (no point, exponent, `inf` or `nan`).
fn is_integer(s: &str) -> bool {
    let digits = s.strip_prefix(['-', '+']).unwrap_or(s);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

fn usize_of(v: &Value) -> Option<usize> {
    match v {
        Value::Num(s) if is_integer(s) && !s.starts_with('-') => s.parse().ok(),
        _ => None,
    }
}
