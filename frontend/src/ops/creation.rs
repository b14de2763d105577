//! Range constructors: [`Tensor::arange`], [`Tensor::linspace`], [`Tensor::eye`], built from
//! `Iota` leaves and pointwise ops so they compile like anything else.

use crate::tensor::Tensor;
use coil_ir::{DType, Error, Result, Scalar};
use std::panic::Location;

impl Tensor {
    /// `torch.arange(start, end, step, dtype=dtype)`: `ceil((end - start) / step)` values
    /// `start + i * step`. Integer dtypes compute in i64 (arguments truncate toward zero);
    /// floating dtypes compute in f64 and round once, as PyTorch's CPU kernel does.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// use coil_ir::DType;
    /// let x = Tensor::arange(0, 10, 3, DType::I64)?;
    /// assert_eq!(x.to_vec::<i64>()?, vec![0, 3, 6, 9]);
    /// let y = Tensor::arange(1.0, 0.0, -0.25, DType::F32)?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![1.0, 0.75, 0.5, 0.25]);
    /// assert!(Tensor::arange(0, 10, -1, DType::I64).is_err());
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn arange(
        start: impl Into<Scalar>,
        end: impl Into<Scalar>,
        step: impl Into<Scalar>,
        dtype: DType,
    ) -> Result<Tensor> {
        let loc = Location::caller();
        let (start, end, step) = (start.into(), end.into(), step.into());
        let fail = |e: Error| Err(e.in_op("arange", vec![]).at(loc));
        if dtype == DType::Bool {
            return fail(Error::dtype("arange is not implemented for bool"));
        }
        if dtype.is_integral() {
            let (s, e, st) = (start.as_i64(), end.as_i64(), step.as_i64());
            if st == 0 {
                return fail(Error::value("step must be nonzero"));
            }
            if (st > 0 && e < s) || (st < 0 && e > s) {
                return fail(Error::value(format!("upper bound and lower bound are inconsistent with the sign of the step: start={s}, end={e}, step={st}")));
            }
            let sgn = st.signum() as i128;
            let n = ((e as i128 - s as i128 + st as i128 - sgn) / st as i128) as usize;
            let mut x = Tensor::iota(&[n], 0)?;
            if st != 1 {
                x = x.mul(st)?;
            }
            if s != 0 {
                x = x.add(s)?;
            }
            return x.to_dtype(dtype);
        }
        let (s, e, st) = (start.as_f64(), end.as_f64(), step.as_f64());
        if !s.is_finite() || !e.is_finite() || !st.is_finite() {
            return fail(Error::value(format!("unsupported range: {s} -> {e} (step {st})")));
        }
        if st == 0.0 {
            return fail(Error::value("step must be nonzero"));
        }
        if (st > 0.0 && e < s) || (st < 0.0 && e > s) {
            return fail(Error::value(format!(
                "upper bound and lower bound are inconsistent with the sign of the step: start={s}, end={e}, step={st}"
            )));
        }
        let n = ((e - s) / st).ceil();
        if !(n >= 0.0 && n < (1u64 << 53) as f64) {
            return fail(Error::value(format!("invalid size {n} for arange({s}, {e}, {st}): it may overflow")));
        }
        let mut x = Tensor::iota(&[n as usize], 0)?.to_dtype(DType::F64)?;
        if st != 1.0 {
            x = x.mul(st)?;
        }
        if s != 0.0 {
            x = x.add(s)?;
        }
        x.to_dtype(dtype)
    }

    /// `torch.linspace(start, end, steps, dtype=dtype)`: `steps` evenly spaced values from
    /// `start` to `end` inclusive. Computed as PyTorch does (`start + i * step` for the first
    /// half, `end - (steps - 1 - i) * step` for the rest, in the output dtype, or f64 for integer
    /// dtypes, whose bounds truncate first) so that values match bit for bit.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// use coil_ir::DType;
    /// let x = Tensor::linspace(0.0, 1.0, 5, DType::F32)?;
    /// assert_eq!(x.to_vec::<f32>()?, vec![0.0, 0.25, 0.5, 0.75, 1.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn linspace(start: impl Into<Scalar>, end: impl Into<Scalar>, steps: usize, dtype: DType) -> Result<Tensor> {
        let loc = Location::caller();
        let (start, end) = (start.into(), end.into());
        if dtype == DType::Bool {
            return Err(Error::dtype("linspace is not implemented for bool").in_op("linspace", vec![]).at(loc));
        }
        if steps == 0 {
            return Ok(Tensor::full(&[0], 0, dtype));
        }
        let (s, e, ct) = if dtype.is_float() {
            (round_to(start.as_f64(), dtype), round_to(end.as_f64(), dtype), dtype)
        } else {
            (start.as_i64() as f64, end.as_i64() as f64, DType::F64)
        };
        if steps == 1 {
            return Ok(Tensor::full(
                &[1],
                if dtype.is_float() { Scalar::Float(s) } else { Scalar::Int(s as i64) },
                dtype,
            ));
        }
        let step = round_to(round_to(e - s, ct) / (steps - 1) as f64, ct);
        let i = Tensor::iota(&[steps], 0)?;
        let front = i.to_dtype(ct)?.mul(step)?.add(s)?;
        let back = i.rsub((steps - 1) as i64)?.to_dtype(ct)?.mul(step)?.rsub(e)?;
        let first_half = i.lt((steps / 2) as i64)?;
        crate::ops::pointwise::where_(&first_half, &front, &back)?.to_dtype(dtype)
    }

    /// `torch.eye(n, m, dtype=dtype)`: ones on the main diagonal of an `n x m` matrix (`m`
    /// defaults to `n`).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// use coil_ir::DType;
    /// let x = Tensor::eye(2, Some(3), DType::F32)?;
    /// assert_eq!(x.to_vec::<f32>()?, vec![1.0, 0.0, 0.0, 0.0, 1.0, 0.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn eye(n: usize, m: Option<usize>, dtype: DType) -> Result<Tensor> {
        let shape = [n, m.unwrap_or(n)];
        let rows = Tensor::iota(&shape, 0)?;
        let cols = Tensor::iota(&shape, 1)?;
        rows.eq(&cols)?.to_dtype(dtype)
    }
}

/// Rounds an f64 to the nearest value of a floating `dtype` (f64 and non-floats unchanged).
fn round_to(x: f64, dtype: DType) -> f64 {
    match dtype {
        DType::F32 => x as f32 as f64,
        DType::F16 => half::f16::from_f64(x).to_f64(),
        DType::BF16 => half::bf16::from_f64(x).to_f64(),
        _ => x,
    }
}
