//! Matrix products: `matmul` (with PyTorch's 1-D and batch-broadcasting rules), `mm`, `bmm`
//! and `linear`.
//!
//! `matmul`, `mm` and `linear` record the composite `Matmul` / `Linear` nodes (decomposed later
//! into `Bmm` with reshapes, expands and a bias add); `bmm` records the primitive directly.

use crate::ops::shape::renamed;
use crate::tensor::Tensor;
use coil_ir::{Error, Op, Result};
use std::panic::Location;

impl Tensor {
    /// `torch.matmul(a, b)` (`a @ b`): a 1-D operand gains a dim that the result then drops,
    /// and batch dims broadcast.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
    /// let b = Tensor::from_vec(vec![1.0f32, 1.0], &[2])?;
    /// let y = a.matmul(&b)?;
    /// assert_eq!(y.shape(), &[2]);
    /// assert_eq!(y.to_vec::<f32>()?, vec![3.0, 7.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        Tensor::record(Op::Matmul, &[self, other], Location::caller())
    }

    /// `torch.mm(a, b)`: the product of two matrices `[n, k] @ [k, m]`; other ranks are an error.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
    /// let b = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0], &[3, 2])?;
    /// assert_eq!(a.mm(&b)?.to_vec::<f32>()?, vec![4.0, 5.0, 10.0, 11.0]);
    /// assert!(a.mm(&a).is_err());
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn mm(&self, other: &Tensor) -> Result<Tensor> {
        let loc = Location::caller();
        let fail = |msg: String| Err(Tensor::error("mm", &[self, other], Error::shape(msg), loc));
        if self.rank() != 2 {
            return fail(format!("self must be a matrix, got {} dims", self.rank()));
        }
        if other.rank() != 2 {
            return fail(format!("mat2 must be a matrix, got {} dims", other.rank()));
        }
        if self.shape()[1] != other.shape()[0] {
            let (a, b) = (self.shape(), other.shape());
            return fail(format!(
                "mat1 and mat2 shapes cannot be multiplied ({}x{} and {}x{})",
                a[0], a[1], b[0], b[1]
            ));
        }
        renamed(Tensor::record(Op::Matmul, &[self, other], loc), "mm")
    }

    /// `torch.bmm(a, b)`: batched products `[b, n, k] @ [b, k, m]`; both operands must be 3-D
    /// with the same batch size.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// use coil_ir::DType;
    /// let a = Tensor::ones(&[4, 2, 3], DType::F32);
    /// let b = Tensor::ones(&[4, 3, 5], DType::F32);
    /// assert_eq!(a.bmm(&b)?.shape(), &[4, 2, 5]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn bmm(&self, other: &Tensor) -> Result<Tensor> {
        let loc = Location::caller();
        for (name, t) in [("batch1", self), ("batch2", other)] {
            if t.rank() != 3 {
                return Err(Tensor::error(
                    "bmm",
                    &[self, other],
                    Error::shape(format!("{name} must be a 3-D tensor, got {} dims", t.rank())),
                    loc,
                ));
            }
        }
        Tensor::record(Op::Bmm, &[self, other], loc)
    }

    /// `F.linear(x, weight, bias)`: `x @ weight^T + bias`, with `x: [..., in]`,
    /// `weight: [out, in]` and an optional `bias: [out]`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[1, 2])?;
    /// let w = Tensor::from_vec(vec![1.0f32, 1.0, 0.0, 2.0, 3.0, 0.0], &[3, 2])?;
    /// let b = Tensor::from_vec(vec![0.5f32, 0.0, -1.0], &[3])?;
    /// assert_eq!(x.linear(&w, Some(&b))?.to_vec::<f32>()?, vec![3.5, 4.0, 2.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn linear(&self, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        let loc = Location::caller();
        match bias {
            Some(b) => Tensor::record(Op::Linear { bias: true }, &[self, weight, b], loc),
            None => Tensor::record(Op::Linear { bias: false }, &[self, weight], loc),
        }
    }
}

/// `F.linear(x, weight, bias)` as a free function; see [`Tensor::linear`].
#[track_caller]
pub fn linear(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    x.linear(weight, bias)
}

#[cfg(test)]
mod tests {
    use super::*;
    use coil_ir::DType;

    fn zeros(shape: &[usize]) -> Tensor {
        Tensor::zeros(shape, DType::F32)
    }

    fn assert_err(r: Result<Tensor>, op: &str) -> Error {
        let e = r.expect_err("expected an error");
        let text = e.to_string();
        assert_eq!(e.op.as_deref(), Some(op), "{text}");
        assert!(text.contains(file!()), "location missing: {text}");
        e
    }

    #[test]
    fn matmul_shapes() {
        assert_eq!(zeros(&[3]).matmul(&zeros(&[3])).unwrap().shape(), &[] as &[usize]);
        assert_eq!(zeros(&[2, 1, 3, 4]).matmul(&zeros(&[5, 4, 2])).unwrap().shape(), &[2, 5, 3, 2]);
        assert_eq!(zeros(&[4]).matmul(&zeros(&[2, 4, 3])).unwrap().shape(), &[2, 3]);
        let e = assert_err(zeros(&[2, 3]).matmul(&zeros(&[4, 5])), "matmul");
        assert!(e.to_string().contains("f32[2, 3], f32[4, 5]"), "{e}");
        assert_err(zeros(&[2, 3]).matmul(&Tensor::zeros(&[3, 2], DType::F16)), "matmul");
    }

    #[test]
    fn mm_and_bmm_check_ranks() {
        let y = zeros(&[2, 3]).mm(&zeros(&[3, 5])).unwrap();
        assert_eq!((y.shape(), &y.0.op), (&[2usize, 5][..], &Op::Matmul));
        assert_err(zeros(&[3]).mm(&zeros(&[3, 5])), "mm");
        assert_err(zeros(&[2, 3]).mm(&zeros(&[2, 3, 5])), "mm");
        assert_err(zeros(&[2, 3]).mm(&zeros(&[4, 5])), "mm");
        assert_err(zeros(&[2, 3]).mm(&Tensor::zeros(&[3, 5], DType::F64)), "mm");
        let z = zeros(&[4, 2, 3]).bmm(&zeros(&[4, 3, 5])).unwrap();
        assert_eq!((z.shape(), &z.0.op), (&[4usize, 2, 5][..], &Op::Bmm));
        assert_err(zeros(&[2, 3]).bmm(&zeros(&[3, 5])), "bmm");
        assert_err(zeros(&[4, 2, 3]).bmm(&zeros(&[1, 4, 3, 5])), "bmm");
        assert_err(zeros(&[4, 2, 3]).bmm(&zeros(&[2, 3, 5])), "bmm");
        assert_err(zeros(&[4, 2, 3]).bmm(&zeros(&[4, 2, 5])), "bmm");
    }

    /// PyTorch adds a bf16 linear's bias before rounding the product (one rounding): here the
    /// product `1 + 2^-6 + 2^-14` rounded first would make `+ 2^-8` a tie that rounds down.
    #[test]
    fn bf16_linear_with_bias_rounds_once_on_every_backend() {
        let bf = |v: f32| Tensor::from_vec(vec![half::bf16::from_f32(v)], &[1, 1]).unwrap();
        let one_ulp = 1.0 + 2f32.powi(-7);
        let (x, w) = (bf(one_ulp), bf(one_ulp));
        let b = Tensor::from_vec(vec![half::bf16::from_f32(2f32.powi(-8))], &[1]).unwrap();
        for backend in [crate::Backend::Interpreter, crate::Backend::Compiled] {
            crate::set_backend(backend);
            let y = x.linear(&w, Some(&b)).unwrap().to_vec::<f32>().unwrap();
            assert_eq!(y, vec![1.0 + 3.0 * 2f32.powi(-7)], "{backend:?}");
        }
    }

    #[test]
    fn linear_with_and_without_bias() {
        let (x, w, b) = (zeros(&[8, 4, 16]), zeros(&[32, 16]), zeros(&[32]));
        let y = x.linear(&w, Some(&b)).unwrap();
        assert_eq!(y.shape(), &[8, 4, 32]);
        assert_eq!(y.0.op, Op::Linear { bias: true });
        assert_eq!(y.0.srcs(&crate::history::read()).len(), 3);
        let y = linear(&x, &w, None).unwrap();
        assert_eq!(y.0.op, Op::Linear { bias: false });
        assert_err(x.linear(&zeros(&[32, 15]), None), "linear");
        assert_err(x.linear(&w, Some(&zeros(&[31]))), "linear");
    }
}
