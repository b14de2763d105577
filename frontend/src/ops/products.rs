//! Products written with `matmul` / `bmm`, reshapes and pointwise ops: `addmm`, `addmv`,
//! `addr`, `baddbmm`, `addbmm`, `outer`, `dot`, `vdot`, `inner`, `mv`, `tensordot`, `kron`,
//! `cross`, `matrix_power`, `multi_dot`, `cdist`. `einsum` is in [`super::einsum`].

use crate::ops::composite::CompositeScope;
use crate::tensor::Tensor;
use coil_ir::{Error, Result};
use std::panic::Location;

fn sizes(shape: &[usize]) -> Vec<i64> {
    shape.iter().map(|&s| s as i64).collect()
}

/// `beta * input + alpha * product`, as PyTorch's `add*` family: `input` must broadcast to the
/// product's shape, and with `beta = 0` it is ignored (its NaNs do not propagate).
fn scaled_sum(
    op: &'static str,
    input: &Tensor,
    product: Tensor,
    beta: f64,
    alpha: f64,
    loc: &'static Location<'static>,
) -> Result<Tensor> {
    let input = input.broadcast_to(product.shape()).map_err(|e| Tensor::error(op, &[input, &product], e, loc))?;
    let product = if alpha == 1.0 { product } else { product.mul(alpha)? };
    if beta == 0.0 {
        return Ok(product);
    }
    let input = if beta == 1.0 { input } else { input.mul(beta)? };
    input.add(&product)
}

/// An error unless `t` has rank `rank`; `what` names the argument as PyTorch does.
fn expect_rank(
    op: &'static str,
    what: &str,
    t: &Tensor,
    rank: usize,
    srcs: &[&Tensor],
    loc: &'static Location<'static>,
) -> Result<()> {
    if t.rank() == rank {
        return Ok(());
    }
    let e = Error::shape(format!("{what} must be a {rank}-D tensor, got {} dims", t.rank()));
    Err(Tensor::error(op, srcs, e, loc))
}

impl Tensor {
    /// `torch.addmm(input, m1, m2, beta, alpha)`: `beta * input + alpha * (m1 @ m2)`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let bias = Tensor::from_vec(vec![1.0f32, 2.0], &[2])?;
    /// let m = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 1.0], &[2, 2])?;
    /// assert_eq!(bias.addmm(&m, &m, 1.0, 2.0)?.to_vec::<f32>()?, vec![3.0, 2.0, 1.0, 4.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn addmm(&self, mat1: &Tensor, mat2: &Tensor, beta: f64, alpha: f64) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("addmm", &[self, mat1, mat2], loc);
        scaled_sum("addmm", self, mat1.mm(mat2)?, beta, alpha, loc)
    }

    /// `torch.addmv(input, mat, vec, beta, alpha)`: `beta * input + alpha * (mat @ vec)`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let y = Tensor::from_vec(vec![1.0f32, 1.0], &[2])?;
    /// let m = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
    /// let v = Tensor::from_vec(vec![1.0f32, 1.0], &[2])?;
    /// assert_eq!(y.addmv(&m, &v, 1.0, 1.0)?.to_vec::<f32>()?, vec![4.0, 8.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn addmv(&self, mat: &Tensor, vec: &Tensor, beta: f64, alpha: f64) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("addmv", &[self, mat, vec], loc);
        scaled_sum("addmv", self, mat.mv(vec)?, beta, alpha, loc)
    }

    /// `torch.addr(input, vec1, vec2, beta, alpha)`: `beta * input + alpha * outer(vec1, vec2)`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let z = Tensor::zeros(&[2, 2], coil_ir::DType::F32);
    /// let v = Tensor::from_vec(vec![1.0f32, 2.0], &[2])?;
    /// assert_eq!(z.addr(&v, &v, 1.0, 1.0)?.to_vec::<f32>()?, vec![1.0, 2.0, 2.0, 4.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn addr(&self, vec1: &Tensor, vec2: &Tensor, beta: f64, alpha: f64) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("addr", &[self, vec1, vec2], loc);
        scaled_sum("addr", self, vec1.outer(vec2)?, beta, alpha, loc)
    }

    /// `torch.baddbmm(input, b1, b2, beta, alpha)`: `beta * input + alpha * bmm(b1, b2)`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// use coil_ir::DType;
    /// let a = Tensor::ones(&[3, 2, 4], DType::F32);
    /// let b = Tensor::ones(&[3, 4, 5], DType::F32);
    /// let y = Tensor::zeros(&[5], DType::F32).baddbmm(&a, &b, 1.0, 0.5)?;
    /// assert_eq!(y.shape(), &[3, 2, 5]);
    /// assert_eq!(y.to_vec::<f32>()?[0], 2.0);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn baddbmm(&self, batch1: &Tensor, batch2: &Tensor, beta: f64, alpha: f64) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("baddbmm", &[self, batch1, batch2], loc);
        scaled_sum("baddbmm", self, batch1.bmm(batch2)?, beta, alpha, loc)
    }

    /// `torch.addbmm(input, b1, b2, beta, alpha)`: `beta * input + alpha * sum_i(b1[i] @ b2[i])`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// use coil_ir::DType;
    /// let a = Tensor::ones(&[3, 2, 4], DType::F32);
    /// let b = Tensor::ones(&[3, 4, 5], DType::F32);
    /// let y = Tensor::zeros(&[2, 5], DType::F32).addbmm(&a, &b, 1.0, 1.0)?;
    /// assert_eq!(y.to_vec::<f32>()?[0], 12.0);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn addbmm(&self, batch1: &Tensor, batch2: &Tensor, beta: f64, alpha: f64) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("addbmm", &[self, batch1, batch2], loc);
        scaled_sum("addbmm", self, batch1.bmm(batch2)?.sum(&[0], false)?, beta, alpha, loc)
    }

    /// `torch.outer(a, b)`: `a[i] * b[j]` for 1-D `a` and `b`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let a = Tensor::from_vec(vec![1i64, 2], &[2])?;
    /// let b = Tensor::from_vec(vec![3i64, 4, 5], &[3])?;
    /// assert_eq!(a.outer(&b)?.to_vec::<i64>()?, vec![3, 4, 5, 6, 8, 10]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn outer(&self, other: &Tensor) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("outer", &[self, other], loc);
        expect_rank("outer", "self", self, 1, &[self, other], loc)?;
        expect_rank("outer", "vec2", other, 1, &[self, other], loc)?;
        self.unsqueeze(1)?.mul(&other.unsqueeze(0)?)
    }

    /// `torch.dot(a, b)`: the inner product of two 1-D tensors of one size and dtype.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3])?;
    /// assert_eq!(a.dot(&a)?.item::<f32>()?, 14.0);
    /// assert_eq!(a.vdot(&a)?.item::<f32>()?, 14.0);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn dot(&self, other: &Tensor) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("dot", &[self, other], loc);
        expect_rank("dot", "1D tensors expected, but got self", self, 1, &[self, other], loc)?;
        expect_rank("dot", "1D tensors expected, but got other", other, 1, &[self, other], loc)?;
        if self.shape() != other.shape() {
            let e = Error::shape(format!(
                "inconsistent tensor size, expected tensor [{}] and src [{}] to have the same number of elements, but got {} and {} elements respectively",
                self.numel(),
                other.numel(),
                self.numel(),
                other.numel()
            ));
            return Err(Tensor::error("dot", &[self, other], e, loc));
        }
        self.matmul(other)
    }

    /// `torch.vdot(a, b)`: [`Tensor::dot`] (coil has no complex dtypes to conjugate).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let a = Tensor::from_vec(vec![1.0f32, 2.0], &[2])?;
    /// assert_eq!(a.vdot(&a)?.item::<f32>()?, 5.0);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn vdot(&self, other: &Tensor) -> Result<Tensor> {
        let _scope = CompositeScope::enter("vdot", &[self, other], Location::caller());
        self.dot(other)
    }

    /// `torch.inner(a, b)`: sums of products over the last dims of both (a scalar times a tensor
    /// for 0-d operands).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
    /// assert_eq!(a.inner(&a)?.to_vec::<f32>()?, vec![5.0, 11.0, 11.0, 25.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn inner(&self, other: &Tensor) -> Result<Tensor> {
        let _scope = CompositeScope::enter("inner", &[self, other], Location::caller());
        if self.rank() == 0 || other.rank() == 0 {
            return self.mul(other);
        }
        self.tensordot(other, &[-1], &[-1])
    }

    /// `torch.mv(mat, vec)`: a matrix `[n, m]` times a vector `[m]`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let m = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
    /// let v = Tensor::from_vec(vec![1.0f32, 0.0], &[2])?;
    /// assert_eq!(m.mv(&v)?.to_vec::<f32>()?, vec![1.0, 3.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn mv(&self, vec: &Tensor) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("mv", &[self, vec], loc);
        expect_rank("mv", "self", self, 2, &[self, vec], loc)?;
        expect_rank("mv", "vec", vec, 1, &[self, vec], loc)?;
        self.matmul(vec)
    }

    /// `torch.tensordot(a, b, dims=(dims_a, dims_b))`: sums of products over `dims_a` of `a`
    /// paired with `dims_b` of `b`; the result has `a`'s other dims, then `b`'s.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// use coil_ir::DType;
    /// let a = Tensor::ones(&[2, 3, 4], DType::F32);
    /// let b = Tensor::ones(&[4, 3, 5], DType::F32);
    /// let y = a.tensordot(&b, &[1, 2], &[1, 0])?;
    /// assert_eq!(y.shape(), &[2, 5]);
    /// assert_eq!(y.to_vec::<f32>()?[0], 12.0);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn tensordot(&self, other: &Tensor, dims_a: &[i64], dims_b: &[i64]) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("tensordot", &[self, other], loc);
        if dims_a.len() != dims_b.len() {
            let e =
                Error::shape(format!("both dimension lists should have same length, got {dims_a:?} and {dims_b:?}"));
            return Err(Tensor::error("tensordot", &[self, other], e, loc));
        }
        let da = self.dims(dims_a, "tensordot", loc)?;
        let db = other.dims(dims_b, "tensordot", loc)?;
        let (da, db) = if dims_a.is_empty() { (vec![], vec![]) } else { (da, db) };
        for (&x, &y) in da.iter().zip(&db) {
            if self.shape()[x] != other.shape()[y] {
                let e = Error::shape(format!(
                    "contracted dimensions need to match, but first has size {} in dim {x} and second has size {} in dim {y}",
                    self.shape()[x],
                    other.shape()[y]
                ));
                return Err(Tensor::error("tensordot", &[self, other], e, loc));
            }
        }
        let free_a: Vec<usize> = (0..self.rank()).filter(|d| !da.contains(d)).collect();
        let free_b: Vec<usize> = (0..other.rank()).filter(|d| !db.contains(d)).collect();
        let k: usize = da.iter().map(|&d| self.shape()[d]).product();
        let m: usize = free_a.iter().map(|&d| self.shape()[d]).product();
        let n: usize = free_b.iter().map(|&d| other.shape()[d]).product();
        let perm_a: Vec<i64> = free_a.iter().chain(&da).map(|&d| d as i64).collect();
        let perm_b: Vec<i64> = db.iter().chain(&free_b).map(|&d| d as i64).collect();
        let a = self.permute(&perm_a)?.reshape(&[m as i64, k as i64])?;
        let b = other.permute(&perm_b)?.reshape(&[k as i64, n as i64])?;
        let mut out: Vec<i64> = free_a.iter().map(|&d| self.shape()[d] as i64).collect();
        out.extend(free_b.iter().map(|&d| other.shape()[d] as i64));
        a.mm(&b)?.reshape(&out)
    }

    /// `torch.kron(a, b)`: the Kronecker product (ranks are aligned by leading ones).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let a = Tensor::from_vec(vec![1i64, 2], &[2])?;
    /// let b = Tensor::from_vec(vec![1i64, 10], &[2])?;
    /// assert_eq!(a.kron(&b)?.to_vec::<i64>()?, vec![1, 10, 2, 20]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn kron(&self, other: &Tensor) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("kron", &[self, other], loc);
        let rank = self.rank().max(other.rank());
        let pad = |t: &Tensor| {
            let mut s = vec![1usize; rank - t.rank()];
            s.extend_from_slice(t.shape());
            s
        };
        let (sa, sb) = (pad(self), pad(other));
        let a_shape: Vec<i64> = sa.iter().flat_map(|&s| [s as i64, 1]).collect();
        let b_shape: Vec<i64> = sb.iter().flat_map(|&s| [1, s as i64]).collect();
        let out = sa.iter().zip(&sb).map(|(&x, &y)| x.checked_mul(y).map(|n| n as i64)).collect::<Option<Vec<i64>>>();
        let Some(out) = out else {
            let e = Error::shape(format!(
                "the Kronecker product of {:?} and {:?} overflows its size",
                self.shape(),
                other.shape()
            ));
            return Err(Tensor::error("kron", &[self, other], e, loc));
        };
        self.reshape(&a_shape)?.mul(&other.reshape(&b_shape)?)?.reshape(&out)
    }

    /// `torch.linalg.cross(a, b, dim)`: the cross product of 3-vectors along `dim` (broadcast).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 0.0, 0.0], &[3])?;
    /// let y = Tensor::from_vec(vec![0.0f32, 1.0, 0.0], &[3])?;
    /// assert_eq!(x.cross(&y, -1)?.to_vec::<f32>()?, vec![0.0, 0.0, 1.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn cross(&self, other: &Tensor, dim: i64) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("cross", &[self, other], loc);
        let shape = self.add(other)?.shape().to_vec();
        let (a, b) = (self.broadcast_to(&shape)?, other.broadcast_to(&shape)?);
        let d = a.dim_of_sized(dim, "cross", loc)?;
        if shape[d] != 3 {
            let e = Error::shape(format!("linalg.cross: inputs dimension {d} must have length 3. Got {}", shape[d]));
            return Err(Tensor::error("cross", &[self, other], e, loc));
        }
        let d = d as i64;
        // c_i = a_{i+1} b_{i+2} - a_{i+2} b_{i+1}: rolls by -1 and -2 line the factors up.
        let (a1, a2) = (a.roll(&[-1], &[d])?, a.roll(&[-2], &[d])?);
        let (b1, b2) = (b.roll(&[-1], &[d])?, b.roll(&[-2], &[d])?);
        a1.mul(&b2)?.sub(&a2.mul(&b1)?)
    }

    /// `torch.linalg.matrix_power(x, n)` for `n >= 0`, by repeated squaring (`n = 0` gives the
    /// identity). A negative `n` needs an inverse, which coil does not have.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let m = Tensor::from_vec(vec![1.0f32, 1.0, 0.0, 1.0], &[2, 2])?;
    /// assert_eq!(m.matrix_power(3)?.to_vec::<f32>()?, vec![1.0, 3.0, 0.0, 1.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn matrix_power(&self, n: i64) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("matrix_power", &[self], loc);
        let r = self.rank();
        if r < 2 || self.shape()[r - 1] != self.shape()[r - 2] {
            let e = Error::shape(format!(
                "matrix_power: expected a square matrix or a batch of them, got {:?}",
                self.shape()
            ));
            return Err(Tensor::error("matrix_power", &[self], e, loc));
        }
        if n < 0 {
            let e = Error::unsupported(
                "matrix_power with a negative exponent needs a matrix inverse, which coil does not have",
            );
            return Err(Tensor::error("matrix_power", &[self], e, loc));
        }
        if n == 0 {
            let k = self.shape()[r - 1];
            let eye = Tensor::eye(k, None, self.dtype())?.to_device(self.device())?;
            return eye.broadcast_to(self.shape());
        }
        let (mut result, mut base, mut n) = (None::<Tensor>, self.clone(), n);
        loop {
            if n & 1 == 1 {
                result = Some(match result {
                    None => base.clone(),
                    Some(r) => r.matmul(&base)?,
                });
            }
            n >>= 1;
            if n == 0 {
                break;
            }
            base = base.matmul(&base)?;
        }
        Ok(result.expect("n > 0"))
    }

    /// `torch.cdist(x1, x2, p)`: the `p`-norm distances between the rows of `x1` `[.., P, M]` and
    /// of `x2` `[.., R, M]`, `[.., P, R]`, computed directly (PyTorch's exact mode).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let a = Tensor::from_vec(vec![0.0f32, 0.0], &[1, 2])?;
    /// let b = Tensor::from_vec(vec![3.0f32, 4.0, 0.0, 1.0], &[2, 2])?;
    /// assert_eq!(a.cdist(&b, 2.0)?.to_vec::<f32>()?, vec![5.0, 1.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn cdist(&self, other: &Tensor, p: f64) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("cdist", &[self, other], loc);
        if self.rank() < 2 || other.rank() < 2 || self.shape()[self.rank() - 1] != other.shape()[other.rank() - 1] {
            let e = Error::shape(format!(
                "cdist expects [.., P, M] and [.., R, M] with the same M, got {:?} and {:?}",
                self.shape(),
                other.shape()
            ));
            return Err(Tensor::error("cdist", &[self, other], e, loc));
        }
        self.unsqueeze(-2)?.sub(&other.unsqueeze(-3)?)?.norm(p, &[-1], false)
    }
}

/// `torch.linalg.multi_dot(tensors)`: the chained matrix product, left to right; a 1-D first
/// (last) operand is a row (column) vector whose dim the result drops.
///
/// ```
/// use coil_frontend::{ops::products::multi_dot, Tensor};
/// let v = Tensor::from_vec(vec![1.0f32, 2.0], &[2])?;
/// let m = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 1.0], &[2, 2])?;
/// assert_eq!(multi_dot(&[&v, &m, &v])?.item::<f32>()?, 5.0);
/// # Ok::<(), coil_ir::Error>(())
/// ```
#[track_caller]
pub fn multi_dot(tensors: &[&Tensor]) -> Result<Tensor> {
    let loc = Location::caller();
    let _scope = CompositeScope::enter("multi_dot", tensors, loc);
    if tensors.len() < 2 {
        return Err(Error::value(format!("multi_dot(): expected at least 2 tensors but got {}", tensors.len()))
            .in_op("multi_dot", vec![])
            .at(loc));
    }
    let last = tensors.len() - 1;
    for (i, t) in tensors.iter().enumerate() {
        let ok = t.rank() == 2 || ((i == 0 || i == last) && t.rank() == 1);
        if !ok {
            let e = Error::shape(format!(
                "multi_dot(): tensor {i} must be 2D (1D allowed first and last), got {}D",
                t.rank()
            ));
            return Err(Tensor::error("multi_dot", tensors, e, loc));
        }
    }
    let mut acc = if tensors[0].rank() == 1 { tensors[0].unsqueeze(0)? } else { tensors[0].clone() };
    for t in &tensors[1..] {
        let t = if t.rank() == 1 { t.unsqueeze(1)? } else { (*t).clone() };
        acc = acc.mm(&t)?;
    }
    let mut out = sizes(acc.shape());
    if tensors[last].rank() == 1 {
        out.pop();
    }
    if tensors[0].rank() == 1 {
        out.remove(0);
    }
    acc.reshape(&out)
}
