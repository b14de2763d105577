//! The loop IR's text: what `ir_pre_fusion.txt` shows, and what [`crate::parse`] reads back
//! ([`LoopProgram::parse`]). Every field of the program is in the text; see [`crate::parse`]
//! for the format.

use super::*;
use crate::philox;
use std::fmt::{self, Write};

impl fmt::Display for ExternCall {
    /// What `ir_pre_fusion.txt` shows after `extern`: `bmm +bias batch=[2] m=4 n=8 k=16`,
    /// `attention causal scale=0.125 batch=[1, 2] l=144 s=144 d=64` (with `out=[strides]` when
    /// the result is not written row-major), `fallback cumsum[dim=0]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExternCall::Bmm { batch, m, n, k, bias, activation, activation_grad, .. } => {
                let mut epilogue = if bias.is_some() { " +bias" } else { "" }.to_string();
                if let Some(act) = activation {
                    epilogue = format!("{epilogue} +{}", act.name());
                }
                if let Some(grad) = activation_grad {
                    epilogue = format!("{epilogue} +{}_grad", grad.activation.name());
                }
                write!(f, "bmm{epilogue} batch={} m={m} n={n} k={k}", exprs(batch))
            }
            ExternCall::Attention(call) => {
                let AttentionCall { out, batch, l, s, d, causal, scale, mask, mask_rule, dropout, .. } = &**call;
                let causal = if *causal { " causal" } else { "" };
                write!(
                    f,
                    "attention{causal} scale={} batch={} l={l} s={s} d={d}",
                    Scalar::Float(*scale),
                    exprs(batch)
                )?;
                let dims: Vec<Expr> = batch.iter().copied().chain([*l, *d]).collect();
                write_layout(f, "out", out, &dims)?;
                if let Some(mask) = mask {
                    let mut strides = mask.batch_strides.clone();
                    strides.extend([mask.row_stride, mask.col_stride]);
                    write!(f, " mask={}", exprs(&strides))?;
                    if mask.offset != Expr::int(0) {
                        write!(f, "+{}", mask.offset)?;
                    }
                }
                if let Some(rule) = mask_rule {
                    write!(f, " mask_rule={rule}")?;
                }
                write_dropout(f, dropout)
            }
            ExternCall::AttentionBackward(call) => {
                let AttentionBackwardCall { dq, dk, dv, batch, l, s, d, causal, scale, mask, dropout, .. } = &**call;
                let causal = if *causal { " causal" } else { "" };
                let grads: Vec<&str> =
                    [(dq, "q"), (dk, "k"), (dv, "v")].iter().filter(|(g, _)| g.is_some()).map(|(_, n)| *n).collect();
                write!(
                    f,
                    "attention_backward{causal} scale={} batch={} l={l} s={s} d={d} grads=[{}]",
                    Scalar::Float(*scale),
                    exprs(batch),
                    grads.join(", ")
                )?;
                for (g, name, rows) in [(dq, "dq", l), (dk, "dk", s), (dv, "dv", s)] {
                    if let Some(g) = g {
                        let dims: Vec<Expr> = batch.iter().copied().chain([*rows, *d]).collect();
                        write_layout(f, name, g, &dims)?;
                    }
                }
                write_mask(f, mask)?;
                write_dropout(f, dropout)
            }
            ExternCall::Fallback { op } => write!(f, "fallback {op}"),
            ExternCall::Conv(call) => {
                let op = Op::Conv { geometry: call.geometry.clone(), form: call.form.clone() };
                write!(f, "{op} a={:?} b={:?} out={:?}", call.a.shape, call.b.shape, call.out)?;
                for (name, v) in [("a", &call.a), ("b", &call.b)] {
                    write!(f, " {name}_strides={:?}", v.strides)?;
                    if v.offset != 0 {
                        write!(f, "+{}", v.offset)?;
                    }
                }
                Ok(())
            }
        }
    }
}

/// ` dropout_p=0.1 dropout_stream=0 dropout_offset=64` of an attention call with dropout.
fn write_dropout(f: &mut fmt::Formatter<'_>, dropout: &Option<crate::op::AttentionDropout>) -> fmt::Result {
    match dropout {
        Some(d) => {
            write!(f, " dropout_p={} dropout_stream={} dropout_offset={}", Scalar::Float(d.p), d.stream, d.offset)
        }
        None => Ok(()),
    }
}

/// ` name=[strides](+offset)` when `op` does not write a `dims` tensor row-major from offset 0.
fn write_layout(f: &mut fmt::Formatter<'_>, name: &str, op: &StridedOperand, dims: &[Expr]) -> fmt::Result {
    let mut strides = op.batch_strides.clone();
    strides.extend([op.row_stride, op.col_stride]);
    if strides != row_major_strides(dims) || op.offset != Expr::int(0) {
        write!(f, " {name}={}", exprs(&strides))?;
        if op.offset != Expr::int(0) {
            write!(f, "+{}", op.offset)?;
        }
    }
    Ok(())
}

/// ` mask=[strides](+offset)` of an attention backward call's explicit mask, if any (as the
/// forward call prints its own).
fn write_mask(f: &mut fmt::Formatter<'_>, mask: &Option<StridedOperand>) -> fmt::Result {
    if let Some(mask) = mask {
        let mut strides = mask.batch_strides.clone();
        strides.extend([mask.row_stride, mask.col_stride]);
        write!(f, " mask={}", exprs(&strides))?;
        if mask.offset != Expr::int(0) {
            write!(f, "+{}", mask.offset)?;
        }
    }
    Ok(())
}

/// Row-major strides of a tensor of `shape` (size-1 dims get their row-major stride too).
fn row_major_strides(shape: &[Expr]) -> Vec<Expr> {
    let mut out = vec![Expr::int(1); shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        out[i] = out[i + 1] * shape[i + 1];
    }
    out
}

/// One body line's right-hand side: `load(buf0, 5*x0)`, `exp(v1)`, ...
fn value_text(p: &LoopProgram, op: &ScalarOp) -> String {
    let buf = |b: &BufferId| p.buffer(*b).name.clone();
    match op {
        ScalarOp::Load { buffer, index } => format!("load({}, {index})", buf(buffer)),
        ScalarOp::MaskedLoad { buffer, index, mask, other } => {
            format!("load({}, {index}, mask={mask}, other={other})", buf(buffer))
        }
        ScalarOp::IndirectLoad { buffer, index, indirect, stride, bound } => {
            format!("load({}, {index}, indirect={indirect}, stride={stride}, bound={bound})", buf(buffer))
        }
        ScalarOp::Constant(c) => format!("constant({c})"),
        ScalarOp::Index(e) => format!("index({e})"),
        ScalarOp::Rand { dist, stream, counter } => {
            let name = if *dist == RandDist::Normal { "randn" } else { "rand" };
            format!("{name}({}, {} + ({counter}))", philox::seed_name(*stream), philox::offset_name(*stream))
        }
        ScalarOp::Unary(op, a) => format!("{}({a})", op.name()),
        ScalarOp::Binary(op, a, b) => format!("{}({a}, {b})", op.name()),
        ScalarOp::Where(c, a, b) => format!("where({c}, {a}, {b})"),
        ScalarOp::Cast(a) => format!("cast({a})"),
    }
}

fn write_body(s: &mut String, p: &LoopProgram, body: &Body) {
    for (i, v) in body.values.iter().enumerate() {
        let _ = writeln!(s, "    v{i}: {} = {}", v.dtype, value_text(p, &v.op));
    }
    let _ = writeln!(s, "    return {}", body.result);
}

/// `[a, b]`.
pub(super) fn exprs(v: &[Expr]) -> String {
    let parts: Vec<String> = v.iter().map(|e| e.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

/// `view(buf0, offset=0, strides=[8, 1])`: a strided operand, its strides the batch strides
/// then the row and column strides.
fn view_text(p: &LoopProgram, o: &StridedOperand) -> String {
    let mut strides = o.batch_strides.clone();
    strides.extend([o.row_stride, o.col_stride]);
    format!("view({}, offset={}, strides={})", p.buffer(o.buffer).name, o.offset, exprs(&strides))
}

/// The operand lines under an extern node: every buffer and stride of the call, which its
/// header line leaves out or shows only in part.
fn write_operands(s: &mut String, p: &LoopProgram, call: &ExternCall) {
    let mut line = |key: &str, value: String| {
        let _ = writeln!(s, "    {key} = {value}");
    };
    let name = |b: BufferId| p.buffer(b).name.clone();
    match call {
        ExternCall::Bmm { a, b, bias, activation_grad, saved, .. } => {
            line("a", view_text(p, a));
            line("b", view_text(p, b));
            if let Some(bias) = bias {
                line("bias", format!("view({}, offset={}, strides=[{}])", name(bias.buffer), bias.offset, bias.stride));
            }
            if let Some(grad) = activation_grad {
                line("aux", name(grad.aux));
            }
            if let Some(saved) = saved {
                line("saved", name(*saved));
            }
        }
        ExternCall::Attention(call) => {
            for (key, o) in [("q", &call.q), ("k", &call.k), ("v", &call.v), ("out", &call.out)] {
                line(key, view_text(p, o));
            }
            if let Some(lse) = call.lse {
                line("lse", name(lse));
            }
            if let Some(mask) = &call.mask {
                line("mask", view_text(p, mask));
            }
            if let Some(offset) = call.mask_rule.as_ref().and_then(|r| r.offset) {
                line("mask_offset", name(offset));
            }
        }
        ExternCall::AttentionBackward(call) => {
            for (key, o) in [("q", &call.q), ("k", &call.k), ("v", &call.v), ("grad_out", &call.grad_out)] {
                line(key, view_text(p, o));
            }
            line("lse", name(call.lse));
            line("out", view_text(p, &call.out));
            for (key, o) in [("dq", &call.dq), ("dk", &call.dk), ("dv", &call.dv), ("mask", &call.mask)] {
                if let Some(o) = o {
                    line(key, view_text(p, o));
                }
            }
        }
        ExternCall::Fallback { .. } => {}
        ExternCall::Conv(call) => {
            for (key, v) in [("a", &call.a), ("b", &call.b)] {
                line(
                    key,
                    format!(
                        "view({}, offset={}, strides={:?}, shape={:?})",
                        name(v.buffer),
                        v.offset,
                        v.strides,
                        v.shape
                    ),
                );
            }
            line("out_strides", format!("{:?}", call.out_strides));
        }
    }
}

/// The order buffers first appear in the text: the inputs, then each node's written buffers.
/// The printer lists the buffers (`buffers:`) only when their ids are not in this order.
pub(crate) fn appearance_order(p: &LoopProgram) -> Vec<BufferId> {
    let mut order: Vec<BufferId> = Vec::new();
    for b in p.inputs.iter().copied().chain(p.nodes.iter().flat_map(|n| n.writes())) {
        if !order.contains(&b) {
            order.push(b);
        }
    }
    order
}

impl fmt::Display for LoopProgram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = String::new();
        let names = |ids: &[BufferId]| ids.iter().map(|b| self.buffer(*b).name.clone()).collect::<Vec<_>>().join(", ");
        let typed = |b: BufferId| format!("{}: {}", self.buffer(b).name, self.buffer(b).type_text());
        for sym in &self.symbols {
            let _ = writeln!(
                s,
                "symbol {} = {}.size({}) (hint {})",
                sym.symbol,
                self.buffer(self.inputs[sym.input]).name,
                sym.dim,
                sym.hint
            );
        }
        for k in 0..self.random_streams() {
            let _ = writeln!(s, "random stream {k}: {}, {}", philox::seed_name(k), philox::offset_name(k));
        }
        let order = appearance_order(self);
        if order.len() != self.buffers.len() || order.iter().enumerate().any(|(i, b)| b.0 != i) {
            // Buffers that no line declares carry their type here.
            let listed: Vec<String> = (0..self.buffers.len())
                .map(BufferId)
                .map(|b| if order.contains(&b) { self.buffer(b).name.clone() } else { typed(b) })
                .collect();
            let _ = writeln!(s, "buffers: {}", listed.join(", "));
        }
        let _ = writeln!(s, "inputs: {}", names(&self.inputs));
        for id in &self.inputs {
            let _ = writeln!(s, "  {}", typed(*id));
        }
        for node in &self.nodes {
            let out = typed(node.output);
            let origins = node.origins.join(", ");
            match &node.kind {
                LoopKind::Pointwise { ranges, body, scatter } => {
                    let _ = writeln!(s, "{out} = pointwise ranges={} origins=[{origins}]", exprs(ranges));
                    write_body(&mut s, self, body);
                    if let Some(st) = scatter {
                        let _ = writeln!(
                            s,
                            "    scatter(base={}, index={}, offset={}, stride={}, size={}, bound={})",
                            self.buffer(st.base).name,
                            st.index,
                            st.offset,
                            st.stride,
                            st.size,
                            st.bound
                        );
                    }
                }
                LoopKind::Reduction { ranges, reduction_ranges, op, body } => {
                    let _ = writeln!(
                        s,
                        "{out} = reduction {} ranges={} reduction_ranges={} origins=[{origins}]",
                        op.name(),
                        exprs(ranges),
                        exprs(reduction_ranges)
                    );
                    write_body(&mut s, self, body);
                }
                LoopKind::Extern { call, inputs } => {
                    // Every buffer the call writes, the node's output first.
                    let written: Vec<String> = node.writes().into_iter().map(typed).collect();
                    let _ =
                        writeln!(s, "{} = extern {call}({}) origins=[{origins}]", written.join(", "), names(inputs));
                    write_operands(&mut s, self, call);
                }
            }
        }
        let _ = writeln!(s, "outputs: {}", names(&self.outputs));
        let or_none = |v: Option<usize>| v.map_or("none".to_string(), |v| v.to_string());
        for c in &self.data_checks {
            let _ = writeln!(
                s,
                "data_check {}: code={} op={} dim={} node={}",
                self.buffer(c.buffer).name,
                c.code,
                c.op,
                or_none(c.dim),
                or_none(c.node)
            );
        }
        f.write_str(&s)
    }
}
