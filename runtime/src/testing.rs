//! Shared by coil's tests (not part of the supported interface): the machine's GPU and C
//! compiler, or `None` after saying why the test is skipped ([`coil_ir::testing::skip`]), so a
//! test that cannot run reports it instead of passing silently. GPU tests stay enabled (not
//! `#[ignore]`d) so that a run on a GPU machine runs them.

use crate::cpu::{c_compiler as configured_c_compiler, CCompiler};
use crate::cuda::{cuda_status, CudaDevice};
use coil_ir::testing::skip;
use std::sync::Arc;

/// The first CUDA GPU, or `None` after printing `skipped: no usable CUDA GPU (<why>)`.
pub fn cuda_device() -> Option<Arc<CudaDevice>> {
    match cuda_status().and_then(|_| CudaDevice::get(0)) {
        Ok(dev) => Some(dev),
        Err(e) => {
            skip(format!("no usable CUDA GPU ({e})"));
            None
        }
    }
}

/// The configured C compiler, or `None` after printing `skipped: no C compiler`.
pub fn c_compiler() -> Option<&'static CCompiler> {
    let found = configured_c_compiler();
    if found.is_none() {
        skip("no C compiler (tried the configured one or $CC, cc, gcc, clang)");
    }
    found
}
