//! Batched matrix products ([`ExternCall::Bmm`]) on the CPU.
//!
//! * f32, f16 and bf16 run through the packed template ([`gemm_packed`]: AVX-512 micro-kernels,
//!   `vdpbf16ps` for bf16 where the CPU has it, AMX tiles where it has those, AVX2 + FMA ones
//!   on CPUs without AVX-512)
//!   whenever this machine's compiler and CPU serve it; each product accumulates in f32 and is
//!   rounded once to its type, as PyTorch's are;
//! * otherwise (and with [`GemmEngine::Crate`]) the `gemm` crate: f32 and f64 directly on the
//!   operands' memory (row, column and batch strides passed as they are, so a transposed or
//!   broadcast operand is never copied); f16 and bf16 operands widened to f32, multiplied by
//!   `gemm` in f32 and the result rounded to nearest even;
//! * a bias row and an activation ([`Activation`], the call's epilogue) apply to the f32 (f64)
//!   sum, before the one rounding to a half type, as cuBLASLt's `CUBLASLT_EPILOGUE_GELU_BIAS`
//!   computes it. The f32 tanh GELU is the C prelude's (the function a generated kernel
//!   computes, vectorized: in the template's epilogue, or for the crate's products
//!   `coil_codegen::c::support_source`, compiled once per process), f64's is Rust's; on the
//!   crate's path bias rows, activations and the half-type conversions run in parallel on the
//!   rayon pool the product uses;
//! * integer products are rare and need exact wrapping arithmetic, so they go to the reference
//!   interpreter on a one-node graph (operands gathered to contiguous buffers first).

use super::compiler::{c_compiler, default_cache_dir};
use super::gemm_packed;
use super::module::{self, Kernel};
use crate::{interpret, Buffer, HostData};
use coil_codegen::c::{support_source, SUPPORT_GELU_TANH_F32, SUPPORT_GELU_TANH_GRAD_F32};
use coil_codegen::templates::gemm_cpu::IsaCap;
use coil_ir::loops::{const_usize, Activation, BiasOperand, ExternCall, StridedOperand};
use coil_ir::{DType, Error, Graph, Op, Result, TensorMeta};
use gemm::Parallelism;
use half::{bf16, f16};
use rayon::prelude::*;
use std::sync::OnceLock;

/// The shape of a batched product: the fields of [`ExternCall::Bmm`] at one run's sizes.
#[derive(Clone, Debug)]
pub struct BmmSpec {
    /// The left operand, `[*batch, m, k]` through its strides.
    pub a: StridedOperand<usize>,
    /// The right operand, `[*batch, k, n]` through its strides.
    pub b: StridedOperand<usize>,
    /// Batch dims of the output (`out` is `[*batch, m, n]`, contiguous).
    pub batch: Vec<usize>,
    /// Rows of each product.
    pub m: usize,
    /// Columns of each product.
    pub n: usize,
    /// The contracted dim.
    pub k: usize,
    /// A row added to every output row (the epilogue of `linear`).
    pub bias: Option<BiasOperand<usize>>,
    /// Applied to every output element after the bias (floats only).
    pub activation: Option<Activation>,
    /// With `Some(act)`, the product is multiplied by `act'(aux)` instead (no bias, no
    /// activation; floats only): [`bmm_bytes_grad`] runs it, given the saved input `aux`.
    pub activation_grad: Option<Activation>,
}

impl BmmSpec {
    /// The spec of a `Bmm` call of an instantiated program (constant sizes); `None` for other
    /// extern calls or symbolic sizes.
    pub fn from_call(call: &ExternCall) -> Option<BmmSpec> {
        match call {
            ExternCall::Bmm { a, b, bias, activation, activation_grad, batch, m, n, k, .. } => Some(BmmSpec {
                a: a.to_usize()?,
                b: b.to_usize()?,
                batch: batch.iter().map(const_usize).collect::<Option<_>>()?,
                m: const_usize(m)?,
                n: const_usize(n)?,
                k: const_usize(k)?,
                bias: match bias {
                    Some(bias) => Some(bias.to_usize()?),
                    None => None,
                },
                activation: *activation,
                activation_grad: activation_grad.map(|g| g.activation),
            }),
            _ => None,
        }
    }

    pub(super) fn batch_count(&self) -> usize {
        self.batch.iter().product()
    }

    /// Element offsets of each batch's `a` and `b` matrices, in row-major batch order.
    pub(super) fn batch_offsets(&self) -> Vec<(usize, usize)> {
        let mut out = Vec::with_capacity(self.batch_count());
        let mut idx = vec![0usize; self.batch.len()];
        for _ in 0..self.batch_count() {
            let off = |op: &StridedOperand<usize>| {
                op.offset + idx.iter().zip(&op.batch_strides).map(|(i, s)| i * s).sum::<usize>()
            };
            out.push((off(&self.a), off(&self.b)));
            // Odometer increment, last dim fastest.
            for d in (0..idx.len()).rev() {
                idx[d] += 1;
                if idx[d] < self.batch[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        out
    }

    /// Checks that every element the product reads lies inside its operand, so the unsafe
    /// strided accesses below cannot leave the buffers whatever the IR says.
    pub(super) fn check(&self, a_len: usize, b_len: usize, bias_len: usize, out_len: usize) -> Result<()> {
        let bad = |msg: String| Err(Error::runtime(format!("bmm: {msg}")));
        if self.a.batch_strides.len() != self.batch.len() || self.b.batch_strides.len() != self.batch.len() {
            return bad(format!(
                "{} batch dims but operand strides {:?} and {:?}",
                self.batch.len(),
                self.a.batch_strides,
                self.b.batch_strides
            ));
        }
        if out_len != self.batch_count() * self.m * self.n {
            return bad(format!("output has {out_len} elements, expected {:?} x {} x {}", self.batch, self.m, self.n));
        }
        if out_len == 0 {
            return Ok(());
        }
        if let Some(bias) = &self.bias {
            let last = bias.offset + (self.n - 1) * bias.stride;
            if last >= bias_len {
                return bad(format!("bias view reaches element {last} of {bias_len}"));
            }
        }
        if self.k == 0 {
            return Ok(());
        }
        let last = |op: &StridedOperand<usize>, rows: usize, cols: usize| {
            op.offset
                + self.batch.iter().zip(&op.batch_strides).map(|(n, s)| (n - 1) * s).sum::<usize>()
                + (rows - 1) * op.row_stride
                + (cols - 1) * op.col_stride
        };
        let (la, lb) = (last(&self.a, self.m, self.k), last(&self.b, self.k, self.n));
        if la >= a_len || lb >= b_len {
            return bad(format!("operand view reaches element {la} of {a_len} / {lb} of {b_len}"));
        }
        Ok(())
    }
}

/// Which implementation multiplies f32, f16 and bf16 matrices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmEngine {
    /// The packed template where this CPU and compiler serve the dtype, else the `gemm` crate;
    /// also the crate for f32 products of few rows or columns
    /// ([`super::gemm_packed::skinny`]).
    Auto,
    /// The packed template ([`super::gemm_packed`]); an error where it cannot run.
    Packed,
    /// The packed template built with AVX2, FMA and F16C at most ([`IsaCap::Avx2`]): on a CPU
    /// with AVX-512, the kernels a CPU without it runs (for tests and benchmarks of that path);
    /// an error where it cannot run.
    PackedAvx2,
    /// The `gemm` crate (half types widened to f32).
    Crate,
}

/// `out = act(a @ b (+ bias))` per batch, on the raw bytes of the buffers (all of `dtype`;
/// `bias` is empty without a bias). `out` must not overlap the operands.
pub fn bmm_bytes(spec: &BmmSpec, dtype: DType, a: &[u8], b: &[u8], bias: &[u8], out: &mut [u8]) -> Result<()> {
    bmm_bytes_with(GemmEngine::Auto, spec, dtype, a, b, bias, out)
}

/// [`bmm_bytes`] by a chosen engine (f64 and integers ignore it).
pub fn bmm_bytes_with(
    engine: GemmEngine,
    spec: &BmmSpec,
    dtype: DType,
    a: &[u8],
    b: &[u8],
    bias: &[u8],
    out: &mut [u8],
) -> Result<()> {
    if spec.activation_grad.is_some() {
        return Err(Error::runtime(
            "bmm: a product with an activation gradient needs its saved input (bmm_bytes_grad)",
        ));
    }
    let size = dtype.size_bytes();
    spec.check(a.len() / size, b.len() / size, bias.len() / size, out.len() / size)?;
    if let Some(done) = packed(engine, spec, dtype, dtype, gemm_packed::Operands { a, b, bias }, out) {
        return done;
    }
    match dtype {
        DType::F32 => {
            let out = cast_mut::<f32>(out)?;
            gemm_float::<f32>(spec, cast(a)?, cast(b)?, cast(bias)?, out, 0.0, 1.0);
            if let Some(act) = spec.activation {
                activate_f32(act, out);
            }
        }
        DType::F64 => {
            let out = cast_mut::<f64>(out)?;
            gemm_float::<f64>(spec, cast(a)?, cast(b)?, cast(bias)?, out, 0.0, 1.0);
            if let Some(act) = spec.activation {
                par_map_in_place(out, |o| act.apply_f64(o));
            }
        }
        DType::F16 => via_f32(spec, cast(a)?, cast(b)?, cast(bias)?, cast_mut(out)?, f16::to_f32, f16::from_f32),
        DType::BF16 => via_f32(spec, cast(a)?, cast(b)?, cast(bias)?, cast_mut(out)?, bf16::to_f32, bf16::from_f32),
        _ if spec.activation.is_some() => {
            return Err(Error::unsupported(format!("a {dtype} matrix product with an activation epilogue")));
        }
        _ => {
            let mut product = integer_bmm(spec, dtype, a, b)?.to_i64_vec();
            if let Some(view) = spec.bias {
                let row = HostData::from_bytes(dtype, bias)?.to_i64_vec();
                for (i, v) in product.iter_mut().enumerate() {
                    *v = v.wrapping_add(row[view.offset + view.stride * (i % spec.n)]);
                }
            }
            out.copy_from_slice(&HostData::from_i64_slice(dtype, &product).to_bytes());
        }
    }
    Ok(())
}

/// The product by the packed template, if `engine` and this machine give it to the template
/// (`None`: the crate's path computes it).
fn packed(
    engine: GemmEngine,
    spec: &BmmSpec,
    dtype: DType,
    out_dtype: DType,
    ops: gemm_packed::Operands,
    out: &mut [u8],
) -> Option<Result<()>> {
    let skinny = engine == GemmEngine::Auto && dtype == DType::F32 && gemm_packed::skinny(spec.m, spec.n);
    if engine == GemmEngine::Crate || skinny || !matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
        return None;
    }
    let cap = if engine == GemmEngine::PackedAvx2 { IsaCap::Avx2 } else { IsaCap::Native };
    match gemm_packed::Library::get(cap).and_then(|lib| Some((lib, lib.layout_for(dtype)?))) {
        Some((lib, layout)) => Some(gemm_packed::bmm(lib, layout, spec, (dtype, out_dtype), ops, out)),
        None if engine != GemmEngine::Auto => Some(Err(Error::unsupported(format!(
            "the packed {dtype} matrix product ({engine:?}) on this machine (it needs a C compiler and AVX-512 or \
             AVX2 with FMA and F16C)"
        )))),
        None => None,
    }
}

/// `saved = a @ b (+ bias)` and `out = act(saved)` per batch: a product whose activation's
/// input a backward reads (`ExternCall::Bmm`'s `saved`). `saved` holds the sum rounded to
/// `dtype` and the activation is computed from that value, as the unfused graph computes it
/// (its bias add is a value of `dtype`); both are contiguous `[*batch, m, n]` of `dtype`.
///
/// ```
/// use coil_ir::loops::{Activation, BufferId, StridedOperand};
/// use coil_runtime::cpu::gemm::{bmm_bytes_saving, BmmSpec};
/// let op = StridedOperand { buffer: BufferId(0), offset: 0usize, batch_strides: vec![0], row_stride: 1, col_stride: 1 };
/// let spec = BmmSpec { a: op.clone(), b: op, batch: vec![1], m: 1, n: 1, k: 1, bias: None,
///     activation: Some(Activation::GeluTanh), activation_grad: None };
/// let (a, b) = (2.0f32, 0.25f32);
/// let (mut saved, mut out) = ([0u8; 4], [0u8; 4]);
/// bmm_bytes_saving(&spec, coil_ir::DType::F32, &a.to_le_bytes(), &b.to_le_bytes(), &[], &mut saved, &mut out).unwrap();
/// assert_eq!(f32::from_le_bytes(saved), 0.5);
/// assert!((f32::from_le_bytes(out) - Activation::GeluTanh.apply_f32(0.5)).abs() < 1e-6);
/// ```
pub fn bmm_bytes_saving(
    spec: &BmmSpec,
    dtype: DType,
    a: &[u8],
    b: &[u8],
    bias: &[u8],
    saved: &mut [u8],
    out: &mut [u8],
) -> Result<()> {
    let Some(act) = spec.activation else {
        return Err(Error::runtime("bmm_bytes_saving: the product has no activation".to_string()));
    };
    if saved.len() != out.len() {
        return Err(Error::runtime(format!(
            "bmm: the activation's saved input has {} bytes, the output {}",
            saved.len(),
            out.len()
        )));
    }
    bmm_bytes(&BmmSpec { activation: None, ..spec.clone() }, dtype, a, b, bias, saved)?;
    out.copy_from_slice(saved);
    /// `x[i] = round(act(x[i]))` chunk by chunk, through f32.
    fn through_f32<T: bytemuck::Pod + Send + Sync>(
        x: &mut [u8],
        act: Activation,
        up: impl Fn(T) -> f32 + Sync,
        down: impl Fn(f32) -> T + Sync,
    ) -> Result<()> {
        let run = |c: &mut [T]| {
            let mut wide: Vec<f32> = c.iter().map(|&v| up(v)).collect();
            activate_f32(act, &mut wide);
            c.iter_mut().zip(wide).for_each(|(o, v)| *o = down(v));
        };
        let x = cast_mut::<T>(x)?;
        if x.len() <= PAR_CHUNK {
            run(x)
        } else {
            x.par_chunks_mut(PAR_CHUNK).for_each(run)
        }
        Ok(())
    }
    match dtype {
        DType::F32 => activate_f32(act, cast_mut::<f32>(out)?),
        DType::F64 => par_map_in_place(cast_mut::<f64>(out)?, |o| act.apply_f64(o)),
        DType::F16 => through_f32::<f16>(out, act, f16::to_f32, f16::from_f32)?,
        DType::BF16 => through_f32::<bf16>(out, act, bf16::to_f32, bf16::from_f32)?,
        _ => return Err(Error::unsupported(format!("a {dtype} matrix product with an activation epilogue"))),
    }
    Ok(())
}

/// `out = (a @ b) * act'(aux)` per batch ([`BmmSpec::activation_grad`] is `act`): the
/// gradient of an activation at its saved input `aux` (`[*batch, m, n]`, contiguous, of
/// `dtype`, as `out`), the product of the incoming gradient `a` and a weight `b`, what
/// cuBLASLt's `CUBLASLT_EPILOGUE_DGELU` computes.
///
/// The product is the plain one ([`bmm_bytes`]: the packed template where it serves), rounded
/// to `dtype` before the derivative (in f32, f64 for f64) multiplies it, as the unfused graph
/// computes it; cuBLASLt multiplies the unrounded product: a difference within the rounding of
/// the half types it serves.
///
/// ```
/// use coil_ir::loops::{Activation, BufferId, StridedOperand};
/// use coil_runtime::cpu::gemm::{bmm_bytes_grad, BmmSpec};
/// let op = StridedOperand { buffer: BufferId(0), offset: 0usize, batch_strides: vec![0], row_stride: 1, col_stride: 1 };
/// let spec = BmmSpec { a: op.clone(), b: op, batch: vec![1], m: 1, n: 1, k: 1, bias: None, activation: None,
///     activation_grad: Some(Activation::GeluTanh) };
/// let (a, b, aux) = (2.0f32, 3.0f32, 0.5f32);
/// let mut out = [0u8; 4];
/// bmm_bytes_grad(&spec, coil_ir::DType::F32, &a.to_le_bytes(), &b.to_le_bytes(), &aux.to_le_bytes(), &mut out).unwrap();
/// let expected = 6.0 * Activation::GeluTanh.grad_f32(0.5);
/// assert!((f32::from_le_bytes(out) - expected).abs() < 1e-6);
/// ```
pub fn bmm_bytes_grad(spec: &BmmSpec, dtype: DType, a: &[u8], b: &[u8], aux: &[u8], out: &mut [u8]) -> Result<()> {
    let Some(act) = spec.activation_grad else {
        return Err(Error::runtime("bmm_bytes_grad: the product has no activation gradient".to_string()));
    };
    if spec.bias.is_some() || spec.activation.is_some() {
        return Err(Error::unsupported("a matrix product with a bias or an activation and an activation gradient"));
    }
    if aux.len() != out.len() {
        return Err(Error::runtime(format!(
            "bmm: the activation's saved input has {} bytes, the output {}",
            aux.len(),
            out.len()
        )));
    }
    bmm_bytes(&BmmSpec { activation_grad: None, ..spec.clone() }, dtype, a, b, &[], out)?;
    /// `g[i] = round(g[i] * act'(x[i]))` chunk by chunk, through f32 (in place for f32).
    fn scale<T: bytemuck::Pod + Send + Sync>(
        g: &mut [u8],
        x: &[u8],
        act: Activation,
        up: impl Fn(T) -> f32 + Sync,
        down: impl Fn(f32) -> T + Sync,
    ) -> Result<()> {
        let (g, x) = (cast_mut::<T>(g)?, cast::<T>(x)?);
        let run = |(g, x): (&mut [T], &[T])| {
            let mut g32: Vec<f32> = g.iter().map(|&v| up(v)).collect();
            let x32: Vec<f32> = x.iter().map(|&v| up(v)).collect();
            grad_f32(act, &mut g32, &x32);
            g.iter_mut().zip(g32).for_each(|(g, v)| *g = down(v));
        };
        if g.len() <= PAR_CHUNK {
            run((g, x))
        } else {
            g.par_chunks_mut(PAR_CHUNK).zip(x.par_chunks(PAR_CHUNK)).for_each(run)
        }
        Ok(())
    }
    match dtype {
        DType::F32 => {
            let (g, x) = (cast_mut::<f32>(out)?, cast::<f32>(aux)?);
            if g.len() <= PAR_CHUNK {
                grad_f32(act, g, x)
            } else {
                g.par_chunks_mut(PAR_CHUNK).zip(x.par_chunks(PAR_CHUNK)).for_each(|(g, x)| grad_f32(act, g, x))
            }
            Ok(())
        }
        DType::F64 => {
            let (g, x) = (cast_mut::<f64>(out)?, cast::<f64>(aux)?);
            g.iter_mut().zip(x).for_each(|(g, &x)| *g *= act.grad_f64(x));
            Ok(())
        }
        DType::F16 => scale::<f16>(out, aux, act, f16::to_f32, f16::from_f32),
        DType::BF16 => scale::<bf16>(out, aux, act, bf16::to_f32, bf16::from_f32),
        _ => Err(Error::unsupported(format!("a {dtype} matrix product with an activation gradient"))),
    }
}

/// `g[i] *= act'(x[i])` on one chunk (the prelude's vectorized derivative where it was built).
fn grad_f32(act: Activation, g: &mut [f32], x: &[f32]) {
    match gelu_support().filter(|_| act == Activation::GeluTanh) {
        Some((_, kernel)) => {
            let n = g.len().min(x.len()) as i64;
            let args = [g.as_mut_ptr() as *mut u8, x.as_ptr() as *mut u8, &n as *const i64 as *mut u8];
            let mut status = [0i64; 4];
            // SAFETY: the support function reads `n` floats at `args[1]` and `n` at `args[2]`,
            // and writes `n` floats at `args[0]`.
            unsafe { kernel.call(&args, &mut status) };
        }
        None => g.iter_mut().zip(x).for_each(|(g, &x)| *g *= act.grad_f32(x)),
    }
}

/// [`bmm_bytes`] with operands (and bias) of `dtype` and `out` of `out_dtype`: the same dtype,
/// or f16 / bf16 operands widened into an f32 result (a product read only by a cast to f32,
/// `coil_passes::lower`'s widening epilogue), computed in f32 and not rounded to the operands'
/// dtype.
pub fn bmm_bytes_to(
    spec: &BmmSpec,
    dtype: DType,
    out_dtype: DType,
    a: &[u8],
    b: &[u8],
    bias: &[u8],
    out: &mut [u8],
) -> Result<()> {
    bmm_bytes_to_with(GemmEngine::Auto, spec, (dtype, out_dtype), a, b, bias, out)
}

/// [`bmm_bytes_to`] by a chosen engine.
pub fn bmm_bytes_to_with(
    engine: GemmEngine,
    spec: &BmmSpec,
    (dtype, out_dtype): (DType, DType),
    a: &[u8],
    b: &[u8],
    bias: &[u8],
    out: &mut [u8],
) -> Result<()> {
    if out_dtype == dtype {
        return bmm_bytes_with(engine, spec, dtype, a, b, bias, out);
    }
    if !matches!((dtype, out_dtype), (DType::F16 | DType::BF16, DType::F32)) {
        return Err(Error::unsupported(format!("a {dtype} matrix product into a {out_dtype} result")));
    }
    if spec.activation.is_some() {
        return Err(Error::unsupported(format!("a widening {dtype} matrix product with an activation epilogue")));
    }
    spec.check(a.len() / 2, b.len() / 2, bias.len() / 2, out.len() / 4)?;
    let ops = gemm_packed::Operands { a, b, bias };
    if let Some(done) = packed(engine, spec, dtype, out_dtype, ops, out) {
        return done;
    }
    let widen = |x: &[u8]| -> Result<Vec<f32>> {
        Ok(match dtype {
            DType::F16 => par_convert(cast::<f16>(x)?, |v| v.to_f32()),
            _ => par_convert(cast::<bf16>(x)?, |v| v.to_f32()),
        })
    };
    gemm_float::<f32>(spec, &widen(a)?, &widen(b)?, &widen(bias)?, cast_mut::<f32>(out)?, 0.0, 1.0);
    Ok(())
}

/// `a @ b` per batch as a new contiguous buffer of shape `[*batch, m, n]`.
pub fn bmm(spec: &BmmSpec, a: &Buffer, b: &Buffer) -> Result<Buffer> {
    if a.dtype() != b.dtype() {
        return Err(Error::dtype(format!("bmm operands differ in dtype: {} and {}", a.dtype(), b.dtype())));
    }
    let shape: Vec<usize> = spec.batch.iter().copied().chain([spec.m, spec.n]).collect();
    let mut out = HostData::try_zeros(a.dtype(), shape.iter().product())?;
    let (a_bytes, b_bytes) = (a.data.to_bytes(), b.data.to_bytes());
    let mut out_bytes = out.to_bytes();
    bmm_bytes(spec, a.dtype(), &a_bytes, &b_bytes, &[], &mut out_bytes)?;
    out = HostData::from_bytes(a.dtype(), &out_bytes)?;
    Buffer::new(shape, out)
}

fn cast<T: bytemuck::Pod>(bytes: &[u8]) -> Result<&[T]> {
    if bytes.is_empty() {
        // An empty slice's dangling pointer need not be aligned for T (an absent bias).
        return Ok(&[]);
    }
    bytemuck::try_cast_slice(bytes).map_err(|e| Error::runtime(format!("bmm operand memory: {e}")))
}

fn cast_mut<T: bytemuck::Pod>(bytes: &mut [u8]) -> Result<&mut [T]> {
    bytemuck::try_cast_slice_mut(bytes).map_err(|e| Error::runtime(format!("bmm output memory: {e}")))
}

/// Below this many multiply-adds a product runs on the calling thread: handing out work to the
/// rayon pool costs more than it saves.
const PARALLEL_FLOPS: usize = 1 << 18;

/// Elements per task of the element-wise loops around a product (bias rows, activations,
/// conversions); a slice no longer than this is done on the calling thread.
const PAR_CHUNK: usize = 1 << 14;

/// `f` applied to every element of `v`, in parallel chunks.
fn par_map_in_place<T: Copy + Send>(v: &mut [T], f: impl Fn(T) -> T + Sync) {
    let run = |c: &mut [T]| c.iter_mut().for_each(|x| *x = f(*x));
    if v.len() <= PAR_CHUNK {
        run(v)
    } else {
        v.par_chunks_mut(PAR_CHUNK).for_each(run)
    }
}

/// `f` of every element of `src`, computed in parallel chunks.
fn par_convert<T: Copy + Sync, U: Copy + Default + Send>(src: &[T], f: impl Fn(T) -> U + Sync) -> Vec<U> {
    let mut out = vec![U::default(); src.len()];
    let run = |(o, s): (&mut [U], &[T])| o.iter_mut().zip(s).for_each(|(o, &s)| *o = f(s));
    if src.len() <= PAR_CHUNK {
        run((&mut out, src))
    } else {
        out.par_chunks_mut(PAR_CHUNK).zip(src.par_chunks(PAR_CHUNK)).for_each(run)
    }
    out
}

/// The support library's gelu and its gradient (`coil_codegen::c::support_source`), built once
/// per process (through the kernel cache); `None` without a C compiler (Rust's tanh then).
fn gelu_support() -> Option<&'static (Kernel, Kernel)> {
    static SUPPORT: OnceLock<Option<(Kernel, Kernel)>> = OnceLock::new();
    SUPPORT
        .get_or_init(|| {
            let cc = c_compiler()?;
            let names = [SUPPORT_GELU_TANH_F32, SUPPORT_GELU_TANH_GRAD_F32];
            let built = module::load_or_build(cc, &support_source(), &default_cache_dir(), &names)
                .and_then(|(lib, _)| Ok((lib.kernel(names[0])?, lib.kernel(names[1])?)));
            built.inspect_err(|e| eprintln!("coil: matrix-product epilogues use Rust's tanh: {e}")).ok()
        })
        .as_ref()
}

/// `act` applied to every element of `out`, in parallel chunks (the prelude's vectorized GELU
/// where it was built).
fn activate_f32(act: Activation, out: &mut [f32]) {
    let Some((kernel, _)) = gelu_support().filter(|_| act == Activation::GeluTanh) else {
        return par_map_in_place(out, |o| act.apply_f32(o));
    };
    let run = |c: &mut [f32]| {
        let n = c.len() as i64;
        let args = [c.as_mut_ptr() as *mut u8, &n as *const i64 as *mut u8];
        let mut status = [0i64; 4];
        // SAFETY: the support function reads `n` and writes `n` floats at `args[0]`.
        unsafe { kernel.call(&args, &mut status) };
    };
    if out.len() <= PAR_CHUNK {
        run(out)
    } else {
        out.par_chunks_mut(PAR_CHUNK).for_each(run)
    }
}

/// The `gemm` crate on one batch after another. `zero` and `one` are the type's 0 and 1. With
/// a bias, each output row starts as the bias and the product accumulates into it.
fn gemm_float<T: Copy + Send + Sync + 'static>(
    spec: &BmmSpec,
    a: &[T],
    b: &[T],
    bias: &[T],
    out: &mut [T],
    zero: T,
    one: T,
) {
    let (m, n, k) = (spec.m, spec.n, spec.k);
    if out.is_empty() {
        return;
    }
    match spec.bias {
        Some(bias_op) if n > 0 => {
            let row = |r: &mut [T]| {
                r.iter_mut().enumerate().for_each(|(j, o)| *o = bias[bias_op.offset + bias_op.stride * j])
            };
            if out.len() <= PAR_CHUNK {
                out.chunks_mut(n).for_each(row)
            } else {
                out.par_chunks_mut(n).for_each(row)
            }
        }
        _ => out.fill(zero),
    }
    if k == 0 {
        // An empty sum; `check` allowed arbitrary offsets, so touch no operand.
        return;
    }
    let parallelism = if m * n * k >= PARALLEL_FLOPS { Parallelism::Rayon(0) } else { Parallelism::None };
    for (bi, (ao, bo)) in spec.batch_offsets().into_iter().enumerate() {
        let dst = out[bi * m * n..(bi + 1) * m * n].as_mut_ptr();
        // SAFETY: `check` proved every element of both views in bounds; `dst` is this batch's
        // m x n block of `out` (row stride n, column stride 1), which overlaps neither operand.
        // With `read_dst = true` and alpha = 1, gemm computes dst = dst + beta * lhs * rhs, and
        // dst holds the bias (or zeros).
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                dst,
                1,
                n as isize,
                true,
                a.as_ptr().add(ao),
                spec.a.col_stride as isize,
                spec.a.row_stride as isize,
                b.as_ptr().add(bo),
                spec.b.col_stride as isize,
                spec.b.row_stride as isize,
                one,
                one,
                false,
                false,
                false,
                parallelism,
            )
        }
    }
}

/// Half types: widen both operands (whole buffers, so the strides still apply), multiply in f32,
/// add the bias and apply the activation in f32, round once.
fn via_f32<T: Copy + Default + Send + Sync>(
    spec: &BmmSpec,
    a: &[T],
    b: &[T],
    bias: &[T],
    out: &mut [T],
    up: impl Fn(T) -> f32 + Sync,
    down: impl Fn(f32) -> T + Sync,
) {
    let (a32, b32, bias32) = (par_convert(a, &up), par_convert(b, &up), par_convert(bias, &up));
    let mut o32 = vec![0f32; out.len()];
    gemm_float::<f32>(spec, &a32, &b32, &bias32, &mut o32, 0.0, 1.0);
    if let Some(act) = spec.activation {
        activate_f32(act, &mut o32);
    }
    let run = |(o, x): (&mut [T], &[f32])| o.iter_mut().zip(x).for_each(|(o, &x)| *o = down(x));
    if out.len() <= PAR_CHUNK {
        run((out, &o32))
    } else {
        out.par_chunks_mut(PAR_CHUNK).zip(o32.par_chunks(PAR_CHUNK)).for_each(run)
    }
}

/// Integers: gather contiguous `[*batch, m, k]` and `[*batch, k, n]` operands and let the
/// reference interpreter compute the product with its wrapping arithmetic.
fn integer_bmm(spec: &BmmSpec, dtype: DType, a: &[u8], b: &[u8]) -> Result<HostData> {
    let (m, n, k) = (spec.m, spec.n, spec.k);
    if spec.batch_count() * m * n == 0 || k == 0 {
        // Nothing to read (and `check` proved nothing in bounds): an empty sum is 0.
        return HostData::try_zeros(dtype, spec.batch_count() * m * n);
    }
    let (a, b) = (HostData::from_bytes(dtype, a)?.to_i64_vec(), HostData::from_bytes(dtype, b)?.to_i64_vec());
    let (mut ca, mut cb) = (Vec::new(), Vec::new());
    for (ao, bo) in spec.batch_offsets() {
        let at =
            |op: &StridedOperand<usize>, base: usize, i: usize, j: usize| base + i * op.row_stride + j * op.col_stride;
        ca.extend((0..m).flat_map(|i| (0..k).map(move |j| (i, j))).map(|(i, j)| a[at(&spec.a, ao, i, j)]));
        cb.extend((0..k).flat_map(|i| (0..n).map(move |j| (i, j))).map(|(i, j)| b[at(&spec.b, bo, i, j)]));
    }
    let dims = |r: usize, c: usize| spec.batch.iter().copied().chain([r, c]).collect::<Vec<_>>();
    let a_buf = Buffer::new(dims(m, k), HostData::from_i64_slice(dtype, &ca))?;
    let b_buf = Buffer::new(dims(k, n), HostData::from_i64_slice(dtype, &cb))?;
    let mut g = Graph::new();
    let x = g.input(TensorMeta::new(a_buf.shape.clone(), dtype));
    let y = g.input(TensorMeta::new(b_buf.shape.clone(), dtype));
    let z = g.push(Op::Bmm, &[x, y], None)?;
    g.outputs.push(z);
    let mut result = interpret(&g, &[&a_buf, &b_buf])?;
    Ok(result.remove(0).into_data())
}
