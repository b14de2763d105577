//! The convolution template's call ([`ConvCall`]) on the host: each operand view gathered
//! into a contiguous buffer, the one-node graph decomposed (im2col and a matrix product, as
//! everywhere else) and interpreted. What the CPU backend runs if a graph kept a convolution
//! whole (the CPU compile path decomposes them first), and what CUDA runs where cuDNN cannot.

use crate::buffer::{Buffer, HostData};
use coil_ir::loops::{ConvCall, TensorView};
use coil_ir::{DType, Graph, Op, Result, TensorMeta};

/// The bytes of `call`'s result (of `dtype`, laid out by `call.out_strides`) from its operands'
/// buffers' bytes.
pub fn conv_bytes(call: &ConvCall, dtype: DType, a: &[u8], b: &[u8]) -> Result<Vec<u8>> {
    let mut g = Graph::new();
    let ids = [&call.a, &call.b].map(|v| g.input(TensorMeta::new(v.shape.clone(), dtype)));
    let y = g.push(Op::Conv { geometry: call.geometry.clone(), form: call.form.clone() }, &ids, None)?;
    g.outputs.push(y);
    let primitive = coil_passes::decompose(&g)?;
    let args = [gather(&call.a, dtype, a)?, gather(&call.b, dtype, b)?];
    let mut out = super::interpret(&primitive, &[&args[0], &args[1]])?;
    let row_major = out.remove(0).data.to_bytes();
    Ok(scatter(&call.out, &call.out_strides, dtype.size_bytes(), &row_major))
}

/// Row-major `bytes` of elements of `size` bytes and `shape` laid out by `strides` (dense).
fn scatter(shape: &[usize], strides: &[usize], size: usize, bytes: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; bytes.len()];
    let mut index = vec![0usize; shape.len()];
    for src in bytes.chunks_exact(size) {
        let at = index.iter().zip(strides).map(|(i, s)| i * s).sum::<usize>() * size;
        out[at..at + size].copy_from_slice(src);
        for d in (0..index.len()).rev() {
            index[d] += 1;
            if index[d] < shape[d] {
                break;
            }
            index[d] = 0;
        }
    }
    out
}

/// The view's elements, row-major, as a buffer of its own.
fn gather(view: &TensorView, dtype: DType, bytes: &[u8]) -> Result<Buffer> {
    let size = dtype.size_bytes();
    let n: usize = view.shape.iter().product();
    let mut out = Vec::with_capacity(n * size);
    let mut index = vec![0usize; view.shape.len()];
    for _ in 0..n {
        let at = view.offset + index.iter().zip(&view.strides).map(|(i, s)| i * s).sum::<usize>();
        let src = bytes.get(at * size..(at + 1) * size).ok_or_else(|| {
            coil_ir::Error::runtime(format!("a convolution operand view {view:?} reaches past its buffer"))
        })?;
        out.extend_from_slice(src);
        for d in (0..index.len()).rev() {
            index[d] += 1;
            if index[d] < view.shape[d] {
                break;
            }
            index[d] = 0;
        }
    }
    Buffer::new(view.shape.clone(), HostData::from_bytes(dtype, &out)?)
}
