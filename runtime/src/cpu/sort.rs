//! `argsort` on the CPU backend: lines in parallel (rayon), each sorted as (key, position)
//! pairs, where the key is an unsigned integer whose order is PyTorch's order of the values
//! (the same keys as the CUDA kernels', `coil_codegen::templates::sort`). Pairs are distinct,
//! so any sort gives the one stable order; the reference interpreter sorts values with a
//! comparator instead, which is what the tests compare this against.

use coil_ir::{DType, Error, Result, TensorMeta};
use half::{bf16, f16};
use rayon::prelude::*;

/// An unsigned key ordered as PyTorch orders `x` ascending: every NaN above `+inf` (and all
/// NaNs equal), `-0.0` equal to `0.0`, negative floats below positive ones.
///
/// ```
/// use coil_runtime::cpu::sort::float_key;
/// assert!(float_key(-1.5) < float_key(-0.0) && float_key(0.0) < float_key(f64::INFINITY));
/// assert_eq!(float_key(-0.0), float_key(0.0));
/// assert!(float_key(f64::INFINITY) < float_key(f64::NAN));
/// ```
pub fn float_key(x: f64) -> u64 {
    if x.is_nan() {
        return u64::MAX;
    }
    // `x + 0.0` turns -0.0 into 0.0 and leaves every other value.
    let bits = (x + 0.0).to_bits();
    if bits >> 63 == 1 {
        !bits
    } else {
        bits | 1 << 63
    }
}

/// An unsigned key ordered as the signed integer `v`.
///
/// ```
/// use coil_runtime::cpu::sort::int_key;
/// assert!(int_key(i64::MIN) < int_key(-1) && int_key(-1) < int_key(0));
/// ```
pub fn int_key(v: i64) -> u64 {
    (v as u64) ^ (1 << 63)
}

/// The key of element `i` of contiguous `bytes` of `dtype`.
fn key(dtype: DType, bytes: &[u8], i: usize) -> u64 {
    let at = |n: usize| &bytes[i * n..(i + 1) * n];
    match dtype {
        DType::Bool | DType::U8 => int_key(bytes[i] as i64),
        DType::I8 => int_key(bytes[i] as i8 as i64),
        DType::I16 => int_key(i16::from_le_bytes(at(2).try_into().expect("2 bytes")) as i64),
        DType::I32 => int_key(i32::from_le_bytes(at(4).try_into().expect("4 bytes")) as i64),
        DType::I64 => int_key(i64::from_le_bytes(at(8).try_into().expect("8 bytes"))),
        DType::F16 => float_key(f16::from_bits(u16::from_le_bytes(at(2).try_into().expect("2 bytes"))).to_f64()),
        DType::BF16 => float_key(bf16::from_bits(u16::from_le_bytes(at(2).try_into().expect("2 bytes"))).to_f64()),
        DType::F32 => float_key(f32::from_le_bytes(at(4).try_into().expect("4 bytes")) as f64),
        DType::F64 => float_key(f64::from_le_bytes(at(8).try_into().expect("8 bytes"))),
    }
}

/// Writes to `out` (contiguous i64 of `x`'s shape) the stable sorting positions of each line of
/// `x` (contiguous bytes of `meta`) along `dim`, as `torch.argsort(x, dim, descending,
/// stable=True)`.
///
/// ```
/// use coil_ir::{DType, TensorMeta};
/// use coil_runtime::cpu::sort::argsort_bytes;
/// let x: Vec<u8> = [2i32, -1, 2, 0].iter().flat_map(|v| v.to_le_bytes()).collect();
/// let mut out = vec![0u8; 4 * 8];
/// argsort_bytes(&x, &TensorMeta::new(vec![4], DType::I32), 0, true, &mut out)?;
/// let positions: Vec<i64> = out.chunks(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect();
/// assert_eq!(positions, vec![0, 2, 3, 1]);
/// # Ok::<(), coil_ir::Error>(())
/// ```
pub fn argsort_bytes(x: &[u8], meta: &TensorMeta, dim: usize, descending: bool, out: &mut [u8]) -> Result<()> {
    let numel = meta.numel();
    if x.len() != numel * meta.dtype.size_bytes() || out.len() != numel * 8 {
        return Err(Error::runtime(format!("argsort of {meta}: buffers of {} and {} bytes", x.len(), out.len())));
    }
    if numel == 0 {
        return Ok(());
    }
    let len = meta.shape.get(dim).copied().unwrap_or(1);
    if len > u32::MAX as usize {
        return Err(Error::unsupported(format!("argsort of {meta} along dim {dim}: lines of 2^32 elements or more")));
    }
    let inner: usize = meta.shape.get(dim + 1..).map_or(1, |s| s.iter().product());
    let lines = numel / len;
    let dtype = meta.dtype;
    // Each line's positions, in order; written through the line's stride after.
    let sorted: Vec<Vec<i64>> = (0..lines)
        .into_par_iter()
        .map(|line| {
            let (o, i) = (line / inner, line % inner);
            let at = |j: usize| (o * len + j) * inner + i;
            let mut pairs: Vec<(u64, u32)> = (0..len)
                .map(|j| {
                    let k = key(dtype, x, at(j));
                    (if descending { !k } else { k }, j as u32)
                })
                .collect();
            pairs.sort_unstable();
            pairs.into_iter().map(|(_, j)| j as i64).collect()
        })
        .collect();
    for (line, positions) in sorted.iter().enumerate() {
        let (o, i) = (line / inner, line % inner);
        for (j, p) in positions.iter().enumerate() {
            let at = ((o * len + j) * inner + i) * 8;
            out[at..at + 8].copy_from_slice(&p.to_le_bytes());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_order_as_pytorch_sorts() {
        let xs = [f64::NEG_INFINITY, -2.5, -1e-300, -0.0, 0.0, 1e-300, 3.0, f64::INFINITY, f64::NAN];
        for w in xs.windows(2) {
            assert!(float_key(w[0]) <= float_key(w[1]), "{} vs {}", w[0], w[1]);
        }
        assert_eq!(float_key(-0.0), float_key(0.0));
        assert_eq!(float_key(f64::NAN), float_key(-f64::NAN));
        assert!(int_key(i64::MIN) < int_key(-1) && int_key(-1) < int_key(0) && int_key(0) < int_key(i64::MAX));
    }

    #[test]
    fn sorts_lines_along_a_middle_dim_stably() {
        // [2, 3, 2] f32, sorted along dim 1.
        let v: [f32; 12] = [3.0, 1.0, f32::NAN, 1.0, 3.0, 0.0, -1.0, 2.0, -1.0, 2.0, -0.0, 2.0];
        let x: Vec<u8> = v.iter().flat_map(|f| f.to_le_bytes()).collect();
        let meta = TensorMeta::new(vec![2, 3, 2], DType::F32);
        let mut out = vec![0u8; 12 * 8];
        let positions =
            |out: &[u8]| -> Vec<i64> { out.chunks(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect() };
        argsort_bytes(&x, &meta, 1, false, &mut out).unwrap();
        // line (0, 0): 3, nan, 3 -> 0, 2, 1; line (0, 1): 1, 1, 0 -> 2, 0, 1;
        // line (1, 0): -1, -1, -0 -> 0, 1, 2; line (1, 1): 2, 2, 2 -> 0, 1, 2.
        assert_eq!(positions(&out), vec![0, 2, 2, 0, 1, 1, 0, 0, 1, 1, 2, 2]);
        argsort_bytes(&x, &meta, 1, true, &mut out).unwrap();
        // descending: nan first, ties keep their order.
        assert_eq!(positions(&out), vec![1, 0, 0, 1, 2, 2, 2, 0, 0, 1, 1, 2]);
    }
}
