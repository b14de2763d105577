//! `cumsum` on the CPU backend: lines in parallel (rayon), each summed in order in f64
//! (wrapping i64 for integers) and every output rounded as the reference interpreter rounds
//! it, so the values are the interpreter's, bit for bit, without decoding the whole tensor
//! into the interpreter's values and back (sampling's top-p and `multinomial` scan a
//! vocabulary-long row per draw).

use crate::interp::round_float;
use coil_ir::{DType, Error, Result, TensorMeta};
use half::{bf16, f16};
use rayon::prelude::*;

/// Whether [`cumsum_bytes`] runs `cumsum` of `x` into `out`: float dtypes in their own dtype,
/// and i64 (the decomposition casts other integers to i64).
pub fn supports_cumsum(x: &TensorMeta, out: &TensorMeta) -> bool {
    x.shape == out.shape
        && x.dtype == out.dtype
        && matches!(x.dtype, DType::F16 | DType::BF16 | DType::F32 | DType::F64 | DType::I64)
}

/// Element `i` of contiguous `bytes` of a float `dtype`, widened to f64.
fn load_float(dtype: DType, bytes: &[u8], i: usize) -> f64 {
    let at = |n: usize| &bytes[i * n..(i + 1) * n];
    match dtype {
        DType::F16 => f16::from_bits(u16::from_le_bytes(at(2).try_into().expect("2 bytes"))).to_f64(),
        DType::BF16 => bf16::from_bits(u16::from_le_bytes(at(2).try_into().expect("2 bytes"))).to_f64(),
        DType::F32 => f32::from_le_bytes(at(4).try_into().expect("4 bytes")) as f64,
        _ => f64::from_le_bytes(at(8).try_into().expect("8 bytes")),
    }
}

/// `v` (already rounded to `dtype`) stored as element `i` of `out`.
fn store_float(dtype: DType, out: &mut [u8], i: usize, v: f64) {
    match dtype {
        DType::F16 => out[i * 2..i * 2 + 2].copy_from_slice(&f16::from_f64(v).to_le_bytes()),
        DType::BF16 => out[i * 2..i * 2 + 2].copy_from_slice(&bf16::from_f64(v).to_le_bytes()),
        DType::F32 => out[i * 4..i * 4 + 4].copy_from_slice(&(v as f32).to_le_bytes()),
        _ => out[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes()),
    }
}

/// Writes `cumsum(x, dim)` to `out` (both contiguous, of `meta`; see [`supports_cumsum`]).
///
/// ```
/// use coil_ir::{DType, TensorMeta};
/// use coil_runtime::cpu::scan::cumsum_bytes;
/// let x: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0].iter().flat_map(|v| v.to_le_bytes()).collect();
/// let mut out = vec![0u8; 16];
/// cumsum_bytes(&x, &TensorMeta::new(vec![2, 2], DType::F32), 0, &mut out)?;
/// let sums: Vec<f32> = out.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
/// assert_eq!(sums, vec![1.0, 2.0, 4.0, 6.0]);
/// # Ok::<(), coil_ir::Error>(())
/// ```
pub fn cumsum_bytes(x: &[u8], meta: &TensorMeta, dim: usize, out: &mut [u8]) -> Result<()> {
    let numel = meta.numel();
    let size = meta.dtype.size_bytes();
    if !supports_cumsum(meta, meta) || x.len() != numel * size || out.len() != numel * size {
        return Err(Error::runtime(format!("cumsum of {meta}: buffers of {} and {} bytes", x.len(), out.len())));
    }
    if numel == 0 {
        return Ok(());
    }
    let dtype = meta.dtype;
    let len = meta.shape.get(dim).copied().unwrap_or(1);
    let inner: usize = meta.shape.get(dim + 1..).map_or(1, |s| s.iter().product());
    let at = move |line: usize, j: usize| (line / inner * len + j) * inner + line % inner;
    // Each line's sums as raw 64-bit words (f64 bits or i64), written through the stride after.
    let lines: Vec<Vec<u64>> = (0..numel / len)
        .into_par_iter()
        .map(|line| {
            if dtype == DType::I64 {
                let mut acc = 0i64;
                (0..len)
                    .map(|j| {
                        let i = at(line, j);
                        acc = acc.wrapping_add(i64::from_le_bytes(x[i * 8..i * 8 + 8].try_into().expect("8 bytes")));
                        acc as u64
                    })
                    .collect()
            } else {
                let mut acc = 0.0f64;
                (0..len)
                    .map(|j| {
                        acc += load_float(dtype, x, at(line, j));
                        round_float(dtype, acc).to_bits()
                    })
                    .collect()
            }
        })
        .collect();
    for (line, sums) in lines.iter().enumerate() {
        for (j, &w) in sums.iter().enumerate() {
            let i = at(line, j);
            if dtype == DType::I64 {
                out[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
            } else {
                store_float(dtype, out, i, f64::from_bits(w));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{interpret, Buffer, HostData};
    use coil_ir::{Graph, Op};

    /// Every dtype and dim of a few shapes, with values of many magnitudes (so the rounding of
    /// each sum matters), against the interpreter, bit for bit.
    #[test]
    fn cumsum_gives_the_interpreters_bits() {
        let mut s = 0x2545_f491_4f6c_dd1du64;
        for shape in [vec![5usize], vec![3, 7], vec![2, 3, 4], vec![1, 300]] {
            for dtype in [DType::F32, DType::F16, DType::BF16, DType::F64, DType::I64] {
                let n: usize = shape.iter().product();
                let values: Vec<f64> = (0..n)
                    .map(|_| {
                        s ^= s << 13;
                        s ^= s >> 7;
                        s ^= s << 17;
                        let m = (s % 2001) as f64 - 1000.0;
                        if dtype == DType::I64 {
                            m * 1e15
                        } else {
                            m * 10f64.powi((s % 9) as i32 - 4)
                        }
                    })
                    .collect();
                let data = if dtype == DType::I64 {
                    HostData::from_i64_slice(dtype, &values.iter().map(|&v| v as i64).collect::<Vec<_>>())
                } else {
                    HostData::from_f64_slice(dtype, &values)
                };
                let x = Buffer::new(shape.clone(), data).unwrap();
                let meta = TensorMeta::new(shape.clone(), dtype);
                for dim in 0..shape.len() {
                    let mut g = Graph::new();
                    let input = g.input(meta.clone());
                    let y = g.push(Op::Cumsum { dim }, &[input], None).unwrap();
                    g.outputs.push(y);
                    let want = interpret(&g, &[&x]).unwrap().remove(0).data.to_bytes();
                    let mut got = vec![0u8; want.len()];
                    cumsum_bytes(&x.data.to_bytes(), &meta, dim, &mut got).unwrap();
                    assert_eq!(got, want, "{dtype} {shape:?} dim {dim}");
                }
            }
        }
    }
}
