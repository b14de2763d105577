//! `scatter` and `scatter_add` on the CPU backend (an embedding's or a gather's gradient),
//! written over the output's bytes, which already hold the base: the runtime copies the base
//! there first, or the memory plan kept the base in the output's memory and nothing is
//! copied. The reference interpreter would decode every operand to f64 and copy the result
//! back. Sources combine in the index's row-major order, rounded as the interpreter rounds
//! (`movement::scatter`), so the values are the interpreter's, bit for bit; an index out of
//! range is left to the interpreter, which names it ([`index_in_range`]).

use coil_ir::{DType, Error, ReduceOp, Result, TensorMeta};
use half::{bf16, f16};

/// Whether [`scatter_bytes`] runs `scatter(x, dim, index, src, reduce)`: no reduction or a
/// sum, of floats, i32 or i64, with an i64 index.
pub fn supports_scatter(x: &TensorMeta, index: &TensorMeta, src: &TensorMeta, reduce: Option<ReduceOp>) -> bool {
    index.dtype == DType::I64
        && src.dtype == x.dtype
        && index.rank() == x.rank()
        && src.rank() == x.rank()
        && matches!(reduce, None | Some(ReduceOp::Sum))
        && matches!(x.dtype, DType::F16 | DType::BF16 | DType::F32 | DType::F64 | DType::I32 | DType::I64)
}

/// Whether every index of `index` (i64 bytes) is within `x`'s size along `dim` (a 0-d `x` has
/// size 1 there, as in PyTorch).
pub fn index_in_range(index: &[u8], x: &TensorMeta, dim: usize) -> bool {
    let size = x.shape.get(dim).copied().unwrap_or(1) as u64;
    index.chunks_exact(8).all(|c| (i64::from_le_bytes(c.try_into().expect("8 bytes")) as u64) < size)
}

/// An element type: its bytes and how `scatter_add` combines two values (as the interpreter
/// does: integers wrap, f16 / bf16 round the f64 sum through f32).
trait Elem: Copy {
    const SIZE: usize;
    fn load(b: &[u8]) -> Self;
    fn store(self, b: &mut [u8]);
    fn add(self, other: Self) -> Self;
}

macro_rules! elem {
    ($t:ty, $size:expr, |$a:ident, $b:ident| $add:expr) => {
        impl Elem for $t {
            const SIZE: usize = $size;
            fn load(b: &[u8]) -> Self {
                <$t>::from_le_bytes(b.try_into().expect("element bytes"))
            }
            fn store(self, b: &mut [u8]) {
                b.copy_from_slice(&self.to_le_bytes());
            }
            fn add(self, other: Self) -> Self {
                let ($a, $b) = (self, other);
                $add
            }
        }
    };
}

elem!(f32, 4, |a, b| a + b);
elem!(f64, 8, |a, b| a + b);
elem!(i32, 4, |a, b| a.wrapping_add(b));
elem!(i64, 8, |a, b| a.wrapping_add(b));
elem!(f16, 2, |a, b| f16::from_f32((a.to_f64() + b.to_f64()) as f32));
elem!(bf16, 2, |a, b| bf16::from_f32((a.to_f64() + b.to_f64()) as f32));

/// Row-major strides of `shape`.
fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for k in (0..shape.len().saturating_sub(1)).rev() {
        s[k] = s[k + 1] * shape[k + 1];
    }
    s
}

/// A 0-d operand behaves as a 1-element 1-D one.
fn shape_1d(shape: &[usize]) -> Vec<usize> {
    if shape.is_empty() {
        vec![1]
    } else {
        shape.to_vec()
    }
}

/// The scatter over elements of type `T`: `x`, `positions` (the index's shape) and `src` are
/// shapes of equal rank (at least 1).
fn run<T: Elem>(
    out: &mut [u8],
    x: &[usize],
    dim: usize,
    sum: bool,
    index: &[u8],
    positions: &[usize],
    src: (&[u8], &[usize]),
) {
    let (xs, ss) = (strides(x), strides(src.1));
    let rank = positions.len();
    let inner = positions[rank - 1];
    let outer: usize = positions[..rank - 1].iter().product();
    // Along the last dim the target moves by its stride, unless the index gives that place.
    let step = if dim == rank - 1 { 0 } else { xs[rank - 1] };
    let mut at = vec![0usize; rank - 1];
    let mut i = 0;
    for _ in 0..outer {
        let x0: usize = (0..rank - 1).filter(|&k| k != dim).map(|k| at[k] * xs[k]).sum();
        let s0: usize = (0..rank - 1).map(|k| at[k] * ss[k]).sum();
        for j in 0..inner {
            let idx = i64::from_le_bytes(index[i * 8..i * 8 + 8].try_into().expect("8 bytes")) as usize;
            let t = (x0 + j * step + idx * xs[dim]) * T::SIZE;
            let s = (s0 + j) * T::SIZE;
            let v = T::load(&src.0[s..s + T::SIZE]);
            let place = &mut out[t..t + T::SIZE];
            let v = if sum { T::load(place).add(v) } else { v };
            v.store(place);
            i += 1;
        }
        for k in (0..rank - 1).rev() {
            at[k] += 1;
            if at[k] < positions[k] {
                break;
            }
            at[k] = 0;
        }
    }
}

/// Writes `scatter(out, dim, index, src)` (combined by `reduce`: see [`supports_scatter`])
/// over `out`, which holds the base, of `x`'s meta; `index` (i64) and `src` are contiguous
/// bytes of their metas, every index in range ([`index_in_range`]).
///
/// ```
/// use coil_ir::{DType, ReduceOp, TensorMeta};
/// use coil_runtime::cpu::scatter::scatter_bytes;
/// let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
/// let mut out = bytes(&[1.0, 1.0, 1.0]);
/// let index: Vec<u8> = [2i64, 0, 2].iter().flat_map(|i| i.to_le_bytes()).collect();
/// let (x, i, s) = (TensorMeta::new(vec![3], DType::F32), TensorMeta::new(vec![3], DType::I64), TensorMeta::new(vec![3], DType::F32));
/// scatter_bytes(&mut out, &x, 0, Some(ReduceOp::Sum), &index, &i, &bytes(&[10.0, 20.0, 30.0]), &s)?;
/// assert_eq!(out, bytes(&[21.0, 1.0, 41.0]));
/// # Ok::<(), coil_ir::Error>(())
/// ```
#[allow(clippy::too_many_arguments)]
pub fn scatter_bytes(
    out: &mut [u8],
    x: &TensorMeta,
    dim: usize,
    reduce: Option<ReduceOp>,
    index: &[u8],
    index_meta: &TensorMeta,
    src: &[u8],
    src_meta: &TensorMeta,
) -> Result<()> {
    let fits = out.len() == x.nbytes() && index.len() == index_meta.nbytes() && src.len() == src_meta.nbytes();
    let (xs, is, ss) = (shape_1d(&x.shape), shape_1d(&index_meta.shape), shape_1d(&src_meta.shape));
    let within = (0..xs.len()).all(|d| is[d] <= ss[d] && (d == dim || is[d] <= xs[d])) && dim < xs.len();
    if !supports_scatter(x, index_meta, src_meta, reduce) || !fits || !within || !index_in_range(index, x, dim) {
        return Err(Error::runtime(format!(
            "cpu scatter of {x} with index {index_meta} and src {src_meta}: unsupported or out of range"
        )));
    }
    if index_meta.numel() == 0 {
        return Ok(());
    }
    let sum = reduce.is_some();
    let src = (src, &ss[..]);
    match x.dtype {
        DType::F32 => run::<f32>(out, &xs, dim, sum, index, &is, src),
        DType::F64 => run::<f64>(out, &xs, dim, sum, index, &is, src),
        DType::F16 => run::<f16>(out, &xs, dim, sum, index, &is, src),
        DType::BF16 => run::<bf16>(out, &xs, dim, sum, index, &is, src),
        DType::I32 => run::<i32>(out, &xs, dim, sum, index, &is, src),
        _ => run::<i64>(out, &xs, dim, sum, index, &is, src),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{interpret, Buffer, HostData};
    use coil_ir::{Graph, Op};

    /// Deterministic values in [-2, 2) (xorshift).
    fn values(n: usize, seed: u64) -> Vec<f64> {
        let mut s = 0x9E37_79B9_7F4A_7C15u64 ^ seed;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 11) as f64 / (1u64 << 53) as f64 * 4.0 - 2.0
            })
            .collect()
    }

    fn buffer(shape: &[usize], dtype: DType, seed: u64) -> Buffer {
        let v = values(shape.iter().product(), seed);
        let data = match dtype.is_float() {
            true => HostData::from_f64_slice(dtype, &v),
            false => HostData::from_i64_slice(dtype, &v.iter().map(|x| (x * 1e9) as i64).collect::<Vec<_>>()),
        };
        Buffer::new(shape.to_vec(), data).unwrap()
    }

    /// The scatter in place over the base's bytes against the interpreter's, bit for bit.
    fn check(x: &[usize], index: &[usize], src: &[usize], dim: usize, dtype: DType, reduce: Option<ReduceOp>) {
        let base = buffer(x, dtype, 1);
        let s = buffer(src, dtype, 2);
        // Few distinct positions along dim: most of them repeat.
        let size = x[dim] as f64;
        let idx: Vec<i64> = values(index.iter().product(), 3).iter().map(|v| ((v + 2.0) / 4.0 * size) as i64).collect();
        let i = Buffer::new(index.to_vec(), HostData::from_i64_slice(DType::I64, &idx)).unwrap();
        let mut g = Graph::new();
        let ids: Vec<_> = [&base, &i, &s].iter().map(|b| g.input(b.meta())).collect();
        let y = g.push(Op::Scatter { dim, reduce }, &ids, None).unwrap();
        g.outputs.push(y);
        let want = interpret(&g, &[&base, &i, &s]).unwrap().remove(0).data.to_bytes();
        let mut out = base.data.to_bytes();
        let bytes = |b: &Buffer| b.data.to_bytes();
        scatter_bytes(&mut out, &base.meta(), dim, reduce, &bytes(&i), &i.meta(), &bytes(&s), &s.meta()).unwrap();
        assert_eq!(out, want, "{dtype} {x:?} {index:?} {src:?} dim {dim} {reduce:?}");
    }

    #[test]
    fn scatter_and_scatter_add_match_the_interpreter_bit_for_bit() {
        for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64] {
            for reduce in [None, Some(ReduceOp::Sum)] {
                // An embedding's gradient: rows into a table, many rows to one place.
                check(&[7, 5], &[40, 5], &[40, 5], 0, dtype, reduce);
                // Along the last dim, an index smaller than src, three dims.
                check(&[3, 4, 6], &[2, 3, 9], &[3, 4, 10], 2, dtype, reduce);
                check(&[3, 4, 6], &[3, 8, 5], &[3, 8, 6], 1, dtype, reduce);
                check(&[5], &[12], &[12], 0, dtype, reduce);
            }
        }
    }

    #[test]
    fn what_it_does_not_run_it_refuses() {
        let (x, i) = (TensorMeta::new(vec![4], DType::F32), TensorMeta::new(vec![2], DType::I64));
        assert!(!supports_scatter(&x, &i, &x, Some(ReduceOp::Max)));
        assert!(!supports_scatter(&TensorMeta::new(vec![4], DType::Bool), &i, &x, None));
        let index: Vec<u8> = [1i64, 4].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert!(!index_in_range(&index, &x, 0));
        let mut out = vec![0u8; 16];
        assert!(
            scatter_bytes(&mut out, &x, 0, None, &index, &i, &[0u8; 8], &TensorMeta::new(vec![2], DType::F32)).is_err()
        );
    }
}
