//! The reference decomposition of the convolution template ([`coil_ir::Op::Conv`]): im2col
//! (one strided slice of the padded input per kernel offset) and one batched matrix product
//! per form, grouped channels as a batch dim. Any number of spatial dims.
//!
//! The columns of `x: [N, C, *in]` are `[N, C, K, L]` (`K` kernel offsets, `L` output
//! positions), channel-major as PyTorch's `F.unfold` orders them, so a group's columns are one
//! contiguous block `[Cg * K, L]` and the weight `[O, Cg, *kernel]` is the matrix
//! `[G, O / G, Cg * K]`.

use super::builder::{upcast_and_back, Builder};
use coil_ir::graph::numel;
use coil_ir::op::{ConvForm, ConvGeometry};
use coil_ir::{NodeId, Op, Result};

/// `form` of the convolution with `geometry` on operands `a` and `b` (see [`ConvForm`]).
pub fn conv(b: &mut Builder, geometry: &ConvGeometry, form: &ConvForm, a: NodeId, c: NodeId) -> Result<NodeId> {
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
            block = spread(b, block, 2 + i, geometry.stride[i])?;
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

/// `x` with `stride - 1` zeros between consecutive elements along `dim`.
fn spread(b: &mut Builder, x: NodeId, dim: usize, stride: usize) -> Result<NodeId> {
    let mut shape = b.shape(x);
    let len = shape[dim];
    if stride == 1 || len <= 1 {
        return Ok(x);
    }
    let x = b.unsqueeze(x, dim + 1)?;
    let mut pads = vec![(0, 0); shape.len() + 1];
    pads[dim + 1] = (0, stride - 1);
    let x = b.push(Op::Pad { pads, value: 0.0.into() }, &[x])?;
    shape[dim] = len * stride;
    let x = b.reshape(x, &shape)?;
    b.push(Op::Slice { dim, start: 0, len: (len - 1) * stride + 1, step: 1 }, &[x])
}

#[cfg(test)]
mod tests {
    use super::offsets;

    #[test]
    fn offsets_are_row_major() {
        assert_eq!(offsets(&[2, 3]).len(), 6);
        assert_eq!(offsets(&[2, 3])[4], vec![1, 1]);
        assert_eq!(offsets(&[3]), vec![vec![0], vec![1], vec![2]]);
    }
}
