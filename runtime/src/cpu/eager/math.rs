//! The tier-0 math library: `coil_codegen::templates::eager_cpu`'s chunk kernels, the one
//! built with the crate where it serves this machine (`super::super::prebuilt`), else compiled
//! once through the kernel cache at the first use in the process (a cache hit in any later
//! process): never per graph or per shape.

use super::super::compiler::{c_compiler, default_cache_dir};
use super::super::module::{self, Kernel};
use super::super::prebuilt;
use coil_codegen::templates::eager_cpu as template;
use coil_ir::{BinaryOp, DType, Error, Result, UnaryOp};
use std::collections::HashMap;
use std::sync::OnceLock;

/// The loaded library: every kernel by name.
pub(super) struct Math {
    kernels: HashMap<String, Kernel>,
}

impl Math {
    /// The process's library; an error (said once) where neither a prebuilt one nor a C
    /// compiler is at hand.
    pub(super) fn get() -> Result<&'static Math> {
        static MATH: OnceLock<std::result::Result<Math, String>> = OnceLock::new();
        MATH.get_or_init(|| {
            let (source, cache_dir) = (template::source(), default_cache_dir());
            let names = template::kernel_names();
            let library = match prebuilt::load(&source, &cache_dir) {
                Some(lib) => lib,
                None => {
                    let compiler = c_compiler().ok_or("no C compiler for the tier-0 math library")?;
                    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
                    module::load_or_build(compiler, &source, &cache_dir, &refs).map_err(|e| e.message)?.0
                }
            };
            let kernels = names
                .into_iter()
                .map(|name| Ok((name.clone(), library.kernel(&name).map_err(|e| e.message)?)))
                .collect::<std::result::Result<_, String>>()?;
            Ok(Math { kernels })
        })
        .as_ref()
        .map_err(|e| Error::runtime(format!("tier-0 math library: {e}")))
    }

    /// The kernel of a unary op over the compute type of `dtype` (f32 or f64).
    pub(super) fn unary(&self, op: UnaryOp, dtype: DType) -> Option<&Kernel> {
        self.kernels.get(&template::unary_kernel(op, dtype))
    }

    /// The kernel of a binary op over the compute type of `dtype` (f32 or f64).
    pub(super) fn binary(&self, op: BinaryOp, dtype: DType) -> Option<&Kernel> {
        self.kernels.get(&template::binary_kernel(op, dtype))
    }
}

/// `out[i] = op(x[i])` over `n` elements through a unary kernel (`T` its compute type).
pub(super) fn call_unary<T>(kernel: &Kernel, x: &[T], out: &mut [T]) {
    let n = x.len().min(out.len()) as i64;
    let args = [x.as_ptr() as *mut u8, out.as_mut_ptr() as *mut u8, &n as *const i64 as *mut u8];
    // SAFETY: the kernel reads `n` elements of `x` and writes `n` of `out`, both at least that
    // long, of the compute type it was generated for (the caller picks it by `T`'s dtype).
    unsafe { kernel.call(&args, &mut [0; 4]) }
}

/// `out[i] = op(a[i], b[i])` over `n` elements through a binary kernel.
pub(super) fn call_binary<T>(kernel: &Kernel, a: &[T], b: &[T], out: &mut [T]) {
    let n = a.len().min(b.len()).min(out.len()) as i64;
    let args = [a.as_ptr() as *mut u8, b.as_ptr() as *mut u8, out.as_mut_ptr() as *mut u8, &n as *const i64 as *mut u8];
    // SAFETY: as `call_unary`, with two operands of `n` elements.
    unsafe { kernel.call(&args, &mut [0; 4]) }
}
