//! The reference decomposition of the convolution template ([`coil_ir::Op::Conv`]): im2col
//! (one strided slice of the padded input per kernel offset) and one batched matrix product
//! per form, grouped channels as a batch dim. Any number of spatial dims.
//!
//! The columns of `x: [N, C, *in]` are `[N, C, K, L]` (`K` kernel offsets, `L` output
//! positions), channel-major as PyTorch's `F.unfold` orders them, so a group's columns are one
//! contiguous block `[Cg * K, L]` and the weight `[O, Cg, *kernel]` is the matrix
//! `[G, O / G, Cg * K]`.
//!
//! A 1x1 convolution without padding or groups ([`is_pointwise`]) whose activations are
//! channels-last views is one matrix product in that layout instead
//! ([`channels_last_product`]): no transposes, and one product for the whole batch.

use super::builder::{upcast_and_back, Builder};
use coil_ir::graph::numel;
use coil_ir::op::{ConvForm, ConvGeometry};
use coil_ir::{NodeId, Op, Result};

/// `form` of the convolution with `geometry` on operands `a` and `b` (see [`ConvForm`]).
pub fn conv(b: &mut Builder, geometry: &ConvGeometry, form: &ConvForm, a: NodeId, c: NodeId) -> Result<NodeId> {
    if let Some(y) = channels_last_product(b, geometry, form, a, c)? {
        return Ok(y);
    }
    match form {
        ConvForm::Forward => forward(b, geometry, a, c),
        // The columns are summed back over overlapping windows: in f32 for f16/bf16, rounded once.
        ConvForm::BackwardData { size } => {
            let w = b.upcast(c)?;
            upcast_and_back(b, a, |b, dy| backward_data(b, geometry, size, dy, w))
        }
        ConvForm::BackwardWeight { kernel } => backward_weight(b, geometry, kernel, a, c),
    }
}

/// Whether a convolution with `kernel` (spatial) is a matrix product: a 1x1 kernel, no
/// padding, one group (with a stride, of the subsampled input; dilation does not matter).
pub fn is_pointwise(geometry: &ConvGeometry, kernel: &[usize]) -> bool {
    kernel.iter().all(|&k| k == 1) && geometry.padding.iter().all(|&p| p == 0) && geometry.groups == 1
}

/// The channels-last tensor `z: [N, *spatial, C]` that `x: [N, C, *spatial]` is a view of:
/// `x` is `permute(z, [0, D + 1, 1, ..., D])` (how a network that keeps its activations
/// channels-last hands them to a convolution). The rule reads the graph's structure only:
/// whatever computes `z`, its rows `[N * L, C]` are then a reshape of it.
fn channels_last_source(b: &Builder, x: NodeId) -> Option<NodeId> {
    let node = b.graph().node(x);
    let Op::Permute { perm } = &node.op else { return None };
    let d = perm.len().checked_sub(2)?;
    let cl: Vec<usize> = [0, d + 1].into_iter().chain(1..=d).collect();
    (*perm == cl).then(|| node.inputs[0])
}

/// `[N, *spatial, K]` as the matrix `[N * L, K]`.
fn rows(b: &mut Builder, z: NodeId) -> Result<NodeId> {
    let s = b.shape(z);
    let k = s[s.len() - 1];
    b.reshape(z, &[numel(&s[..s.len() - 1]), k])
}

/// A 1x1 convolution ([`is_pointwise`]) whose activations are channels-last views
/// ([`channels_last_source`]), as one product over the whole batch in that layout (`M` or `K`
/// is `N * L`); the result is a channels-last tensor permuted to the form's `[N, C, *spatial]`,
/// so a reader that permutes it back reads it in place. A strided forward (and weight gradient)
/// reads the subsampled input; a strided data gradient spreads its rows back with zeros. `None`
/// where the rule does not apply: other convolutions, and activations laid out `[N, C, *]`,
/// keep the per-batch form.
///
/// * forward: `y[N * L, O] = x[N * L, C] @ w[O, C]^T`;
/// * data gradient: `dx[N * L, C] = dy[N * L, O] @ w[O, C]`;
/// * weight gradient (both operands channels-last): `dw[O, C] = dy[N * L, O]^T @ x[N * L, C]`.
fn channels_last_product(
    b: &mut Builder,
    geometry: &ConvGeometry,
    form: &ConvForm,
    a: NodeId,
    c: NodeId,
) -> Result<Option<NodeId>> {
    let kernel = match form {
        ConvForm::BackwardWeight { kernel } => kernel.clone(),
        ConvForm::Forward | ConvForm::BackwardData { .. } => b.shape(c)[2..].to_vec(),
    };
    if !is_pointwise(geometry, &kernel) {
        return Ok(None);
    }
    let d = geometry.dims();
    let channels_first: Vec<usize> = [0, d + 1].into_iter().chain(1..=d).collect();
    let matrix = |b: &mut Builder, w: NodeId| {
        let ws = b.shape(w);
        b.reshape(w, &ws[..2])
    };
    let y = match form {
        ConvForm::Forward => {
            let Some(x) = channels_last_source(b, a) else { return Ok(None) };
            let x = subsample(b, geometry, x)?;
            let mut shape = b.shape(x);
            let w = matrix(b, c)?;
            shape[d + 1] = b.shape(w)[0];
            let (x, wt) = (rows(b, x)?, b.transpose(w, 0, 1)?);
            let y = b.bmm(x, wt)?;
            b.reshape(y, &shape)?
        }
        ConvForm::BackwardData { size } => {
            let Some(dy) = channels_last_source(b, a) else { return Ok(None) };
            let mut shape = b.shape(dy);
            let w = matrix(b, c)?;
            shape[d + 1] = b.shape(w)[1];
            let dy = rows(b, dy)?;
            let dx = b.bmm(dy, w)?;
            let mut dx = b.reshape(dx, &shape)?;
            // Each input position a window read gets its row; the others (between the
            // strides, and past the last window) get zeros.
            for (i, &len) in size.iter().enumerate() {
                dx = b.spread(dx, 1 + i, geometry.stride[i])?;
                let have = b.shape(dx)[1 + i];
                if have < len {
                    let mut pads = vec![(0, 0); d + 2];
                    pads[1 + i] = (0, len - have);
                    dx = b.push(Op::Pad { pads, value: 0.0.into() }, &[dx])?;
                }
            }
            dx
        }
        ConvForm::BackwardWeight { kernel } => {
            let (Some(x), Some(dy)) = (channels_last_source(b, a), channels_last_source(b, c)) else {
                return Ok(None);
            };
            let x = subsample(b, geometry, x)?;
            let (o, ch) = (b.shape(dy)[d + 1], b.shape(x)[d + 1]);
            let (x, dy) = (rows(b, x)?, rows(b, dy)?);
            let dyt = b.transpose(dy, 0, 1)?;
            let dw = b.bmm(dyt, x)?;
            return Ok(Some(b.reshape(dw, &[&[o, ch][..], kernel].concat())?));
        }
    };
    Ok(Some(b.permute(y, &channels_first)?))
}

/// The positions a strided 1x1 convolution reads of channels-last `x: [N, *in, C]`: every
/// `stride`-th along each spatial dim.
fn subsample(b: &mut Builder, geometry: &ConvGeometry, mut x: NodeId) -> Result<NodeId> {
    for (i, &step) in geometry.stride.iter().enumerate() {
        let n = b.shape(x)[1 + i];
        if step > 1 && n > 1 {
            let len = (n - 1) / step + 1;
            x = b.push(Op::Slice { dim: 1 + i, start: 0, len, step: step as i64 }, &[x])?;
        }
    }
    Ok(x)
}

/// `y = w @ cols(x)` per group: `[N, G, O / G, L]` as `[N, O, *out]`.
fn forward(b: &mut Builder, geometry: &ConvGeometry, x: NodeId, w: NodeId) -> Result<NodeId> {
    let (xs, ws) = (b.shape(x), b.shape(w));
    let (n, g, o) = (xs[0], geometry.groups, ws[0]);
    let kernel = &ws[2..];
    let out = geometry.out_size(&xs[2..], kernel)?;
    let cols = unfold(b, geometry, x, kernel, &out)?;
    let row = ws[1] * numel(kernel);
    let cols = b.reshape(cols, &[n, g, row, numel(&out)])?;
    let w = b.reshape(w, &[1, g, o / g, row])?;
    let w = b.expand(w, &[n, g, o / g, row])?;
    let y = b.bmm(w, cols)?;
    b.reshape(y, &[&[n, o][..], &out].concat())
}

/// `dx = fold(w^T @ dy)` per group: each output position's gradient spread back over the
/// input positions its window read.
fn backward_data(b: &mut Builder, geometry: &ConvGeometry, size: &[usize], dy: NodeId, w: NodeId) -> Result<NodeId> {
    let (ds, ws) = (b.shape(dy), b.shape(w));
    let (n, g, o, cg) = (ds[0], geometry.groups, ws[0], ws[1]);
    let kernel = &ws[2..];
    let (k, l) = (numel(kernel), numel(&ds[2..]));
    let w = b.reshape(w, &[1, g, o / g, cg * k])?;
    let wt = b.transpose(w, 2, 3)?;
    let wt = b.expand(wt, &[n, g, cg * k, o / g])?;
    let dy = b.reshape(dy, &[n, g, o / g, l])?;
    let cols = b.bmm(wt, dy)?;
    let cols = b.reshape(cols, &[n, cg * g, k, l])?;
    fold(b, geometry, cols, size, kernel, &ds[2..])
}

/// `dw = dy @ cols(x)^T` per group, the batch folded into the contraction:
/// `[G, O / G, N * L] @ [G, N * L, Cg * K]`.
fn backward_weight(
    b: &mut Builder,
    geometry: &ConvGeometry,
    kernel: &[usize],
    x: NodeId,
    dy: NodeId,
) -> Result<NodeId> {
    let (xs, ds) = (b.shape(x), b.shape(dy));
    let (n, c, g, o) = (xs[0], xs[1], geometry.groups, ds[1]);
    let out = &ds[2..];
    let (k, l) = (numel(kernel), numel(out));
    let cols = unfold(b, geometry, x, kernel, out)?;
    let cols = b.reshape(cols, &[n, g, c / g * k, l])?;
    let cols = b.permute(cols, &[1, 0, 3, 2])?; // [G, N, L, Cg * K]
    let cols = b.reshape(cols, &[g, n * l, c / g * k])?;
    let dy = b.reshape(dy, &[n, g, o / g, l])?;
    let dy = b.permute(dy, &[1, 2, 0, 3])?; // [G, O / G, N, L]
    let dy = b.reshape(dy, &[g, o / g, n * l])?;
    let dw = b.bmm(dy, cols)?;
    b.reshape(dw, &[&[o, c / g][..], kernel].concat())
}

/// Every kernel offset of `kernel` (spatial), row-major.
fn offsets(kernel: &[usize]) -> Vec<Vec<usize>> {
    let mut all = vec![vec![]];
    for &k in kernel {
        all = all.into_iter().flat_map(|prefix| (0..k).map(move |i| [&prefix[..], &[i]].concat())).collect();
    }
    all
}

/// The im2col columns `[N, C, K, L]` of `x: [N, C, *in]`: per kernel offset, the padded input
/// sliced from `offset * dilation` by `stride`, `out` positions per spatial dim.
fn unfold(b: &mut Builder, geometry: &ConvGeometry, x: NodeId, kernel: &[usize], out: &[usize]) -> Result<NodeId> {
    let xs = b.shape(x);
    let (n, c, l) = (xs[0], xs[1], numel(out));
    let padded = if geometry.padding.iter().any(|&p| p > 0) {
        let pads = [(0, 0), (0, 0)].into_iter().chain(geometry.padding.iter().map(|&p| (p, p))).collect();
        b.push(Op::Pad { pads, value: 0.0.into() }, &[x])?
    } else {
        x
    };
    let mut blocks = Vec::new();
    for offset in offsets(kernel) {
        let mut block = padded;
        for (i, &at) in offset.iter().enumerate() {
            let (start, len) = (at * geometry.dilation[i], out[i]);
            if b.shape(block)[2 + i] != len || start != 0 || (geometry.stride[i] != 1 && len > 1) {
                let step = geometry.stride[i] as i64;
                block = b.push(Op::Slice { dim: 2 + i, start, len, step }, &[block])?;
            }
        }
        blocks.push(b.reshape(block, &[n, c, 1, l])?);
    }
    if blocks.len() == 1 {
        return Ok(blocks[0]);
    }
    b.push(Op::Cat { dim: 2 }, &blocks)
}

/// col2im, the adjoint of [`unfold`]: sums the columns `[N, C, K, L]` back into
/// `[N, C, *size]`. Each kernel offset's block is spread to the stride (zeros between), padded
/// into place in the padded input and added; the padding is cut off at the end.
fn fold(
    b: &mut Builder,
    geometry: &ConvGeometry,
    cols: NodeId,
    size: &[usize],
    kernel: &[usize],
    out: &[usize],
) -> Result<NodeId> {
    let cs = b.shape(cols);
    let (n, c, d) = (cs[0], cs[1], size.len());
    let padded: Vec<usize> = (0..d).map(|i| size[i] + 2 * geometry.padding[i]).collect();
    let mut total: Option<NodeId> = None;
    for (k, offset) in offsets(kernel).iter().enumerate() {
        let block = b.push(Op::Slice { dim: 2, start: k, len: 1, step: 1 }, &[cols])?;
        let mut block = b.reshape(block, &[&[n, c][..], out].concat())?;
        for i in 0..d {
            block = b.spread(block, 2 + i, geometry.stride[i])?;
        }
        let mut pads = vec![(0, 0), (0, 0)];
        for i in 0..d {
            let before = offset[i] * geometry.dilation[i];
            pads.push((before, padded[i] - before - b.shape(block)[2 + i]));
        }
        let placed = b.push(Op::Pad { pads, value: 0.0.into() }, &[block])?;
        total = Some(match total {
            None => placed,
            Some(t) => b.add(t, placed)?,
        });
    }
    let mut y = total.expect("a kernel has at least one offset");
    for (i, (&p, &len)) in geometry.padding.iter().zip(size).enumerate() {
        if p > 0 {
            y = b.push(Op::Slice { dim: 2 + i, start: p, len, step: 1 }, &[y])?;
        }
    }
    Ok(y)
}

#[cfg(test)]
mod tests {
    use super::offsets;
    use crate::test_graph::Capture;
    use crate::{autodiff, decompose_with, lower, simplify, DecomposeOptions, RewriteOptions};
    use coil_ir::loops::{ExternCall, LoopKind, LoopProgram};
    use coil_ir::op::{ConvForm, ConvGeometry};
    use coil_ir::{DType, Graph, NodeId, Op, ReduceOp};

    const BF16: DType = DType::BF16;

    /// A ResNet-style 1x1 convolution on channels-last activations `z: [2, 6, 5, 8]`
    /// (permuted to `[N, C, H, W]`, convolved, permuted back, then a relu), with `stride`.
    fn channels_last_block(c: &mut Capture, stride: usize) -> (NodeId, NodeId, NodeId) {
        let z = c.input(&[2, 6, 5, 8], BF16);
        let w = c.input(&[12, 8, 1, 1], BF16);
        let x = c.permute(z, &[0, 3, 1, 2]);
        let geometry = ConvGeometry { stride: vec![stride; 2], padding: vec![0; 2], dilation: vec![1; 2], groups: 1 };
        let y = c.op(Op::Conv { geometry, form: ConvForm::Forward }, &[x, w]);
        let y = c.permute(y, &[0, 2, 3, 1]);
        (z, w, c.op(Op::Relu, &[y]))
    }

    fn compiled(g: &Graph, options: &DecomposeOptions) -> LoopProgram {
        let p = decompose_with(g, options).unwrap();
        let (p, _) = simplify(&p, &RewriteOptions::default()).unwrap();
        lower(&p).unwrap()
    }

    /// The products of a program: `(batch, m, n, k)`.
    fn products(p: &LoopProgram) -> Vec<(usize, String, String, String)> {
        p.nodes
            .iter()
            .filter_map(|n| match &n.kind {
                LoopKind::Extern { call: ExternCall::Bmm { batch, m, n, k, .. }, .. } => {
                    Some((batch.len(), m.to_string(), n.to_string(), k.to_string()))
                }
                _ => None,
            })
            .collect()
    }

    /// Nodes that only move data (a transpose or reshape copy) for another node to read, or
    /// scatter. (A graph output that is a reshape of a product is copied into its own buffer:
    /// the lowering's rule for outputs, not the convolution's.)
    fn copies_and_scatters(p: &LoopProgram) -> usize {
        let only_moves = |o: &[&str]| !o.is_empty() && o.iter().all(|o| ["permute", "reshape"].contains(o));
        let scatter = |k: &LoopKind| matches!(k, LoopKind::Extern { call: ExternCall::Fallback { .. }, .. });
        let copy = |n: &coil_ir::loops::LoopNode| only_moves(&n.origins) && !p.outputs.contains(&n.output);
        p.nodes.iter().filter(|n| copy(n) || scatter(&n.kind)).count()
    }

    const COMPILE: DecomposeOptions =
        DecomposeOptions { fused_attention: true, keep_detach: false, half_products: true, conv_template: true };

    #[test]
    fn channels_last_1x1_forward_is_one_product_and_no_transpose() {
        for stride in [1, 2] {
            let mut c = Capture::new();
            let (_, _, y) = channels_last_block(&mut c, stride);
            let p = compiled(&c.out(&[y]), &COMPILE);
            let rows = if stride == 1 { 2 * 6 * 5 } else { 2 * 3 * 3 };
            assert_eq!(products(&p), vec![(0, rows.to_string(), "12".into(), "8".into())], "{p}");
            assert_eq!(copies_and_scatters(&p), 0, "{p}");
            // The product, the relu; with a stride, a copy of the subsampled input before.
            assert_eq!(p.nodes.len(), if stride == 1 { 2 } else { 3 }, "{p}");
        }
    }

    #[test]
    fn channels_first_1x1_keeps_the_per_batch_product() {
        let mut c = Capture::new();
        let x = c.input(&[2, 8, 6, 5], BF16);
        let w = c.input(&[12, 8, 1, 1], BF16);
        let geometry = ConvGeometry { stride: vec![1; 2], padding: vec![0; 2], dilation: vec![1; 2], groups: 1 };
        let y = c.op(Op::Conv { geometry, form: ConvForm::Forward }, &[x, w]);
        let p = compiled(&c.out(&[y]), &COMPILE);
        // Batch dims [N, G]: one product per image.
        assert_eq!(products(&p), vec![(2, "12".into(), "30".into(), "8".into())], "{p}");
        assert_eq!(copies_and_scatters(&p), 0, "{p}");
    }

    /// The training step of the block, as `value_and_grad` builds it: the forward decomposed
    /// for differentiation (the 1x1 convolution a product), its gradients by autodiff. Three
    /// products over the whole batch (forward, data gradient, weight gradient with
    /// `k = N * L`), no transpose copies, and the strided slice's gradient no scatter.
    #[test]
    fn channels_last_1x1_training_is_three_products_and_no_scatter() {
        for stride in [1, 2] {
            let mut c = Capture::new();
            let (z, w, y) = channels_last_block(&mut c, stride);
            let shape = c.g.meta(y).shape.clone();
            let weights = c.input(&shape, BF16);
            let weighted = c.op(Op::Binary(coil_ir::BinaryOp::Mul), &[y, weights]);
            let loss = c.op(Op::Reduce { op: ReduceOp::Sum, dims: vec![0, 1, 2, 3], keepdim: false }, &[weighted]);
            let loss = c.op(Op::Cast(DType::F32), &[loss]);
            let g = c.out(&[loss]);
            let options = DecomposeOptions { keep_detach: true, ..COMPILE };
            let mut p = decompose_with(&g, &options).unwrap();
            let (z, w, loss) = (p.inputs[z.0], p.inputs[w.0], p.outputs[0]);
            let grads = autodiff::backward(&mut p, loss, None, &[z, w]).unwrap();
            p.outputs = [loss].into_iter().chain(grads).collect();
            let program = compiled(&p, &DecomposeOptions { keep_detach: false, ..COMPILE });
            let l = if stride == 1 { 2 * 6 * 5 } else { 2 * 3 * 3 };
            let mut got = products(&program);
            got.sort();
            let want =
                [(l, 12, 8), (l, 8, 12), (12, 8, l)].map(|(m, n, k)| (0, m.to_string(), n.to_string(), k.to_string()));
            let mut want = want.to_vec();
            want.sort();
            assert_eq!(got, want, "{program}");
            assert_eq!(copies_and_scatters(&program), 0, "{program}");
        }
    }

    #[test]
    fn offsets_are_row_major() {
        assert_eq!(offsets(&[2, 3]).len(), 6);
        assert_eq!(offsets(&[2, 3])[4], vec![1, 1]);
        assert_eq!(offsets(&[3]), vec![vec![0], vec![1], vec![2]]);
    }
}
