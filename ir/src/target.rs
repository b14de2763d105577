//! What code generation and the cost models know about a GPU ([`GpuTarget`]).
//!
//! The runtime reads one from the device (`coil_runtime::cuda::CudaDevice::target`, from the
//! driver's device attributes) and hands it to the code generator's launch rules (blocks in
//! flight per SM, the L2 share a two-pass reduction may count on, occupancy hints, the
//! attention template's split of keys over SMs) and to the cost models. [`GpuTarget::h100`]
//! is the default where no GPU is at hand: host-side code generation (reading generated
//! kernels on a machine without a GPU) and tests.

/// The tensor-core instructions a GPU has, oldest first (ordered: a later generation has the
/// instructions of the earlier ones that coil uses).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TensorCores {
    /// None (before Volta).
    None,
    /// `mma.sync.m8n8k4` on f16 (sm_70, sm_75).
    Volta,
    /// `mma.sync.m16n8k16` on f16 and bf16, `ldmatrix`, `cp.async` (sm_80 to sm_89).
    Ampere,
    /// Hopper's `wgmma` and thread-block clusters besides (sm_90).
    Hopper,
    /// Blackwell's `tcgen05` besides (sm_100 and later).
    Blackwell,
}

/// The GPU that code is generated for: the numbers the launch rules depend on.
///
/// ```
/// use coil_ir::target::{GpuTarget, TensorCores};
/// let h100 = GpuTarget::h100();
/// assert_eq!((h100.arch(), h100.sm_count), (90, 132));
/// assert_eq!(h100.tensor_cores(), TensorCores::Hopper);
/// assert!(GpuTarget::a100().tensor_cores() >= TensorCores::Ampere);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GpuTarget {
    /// Compute capability `(major, minor)`: `(9, 0)` for sm_90.
    pub compute_capability: (u32, u32),
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Bytes of L2 cache.
    pub l2_bytes: usize,
    /// Most shared memory one block may use, opting in (`cudaFuncAttributeMaxDynamicSharedMemorySize`).
    pub shared_per_block_optin: usize,
    /// Shared memory of one SM, in bytes.
    pub shared_per_sm: usize,
    /// 32-bit registers of one SM.
    pub registers_per_sm: u32,
    /// Most resident threads of one SM.
    pub max_threads_per_sm: u32,
    /// Whether kernels may launch as thread-block clusters (sm_90 and later).
    pub clusters: bool,
}

impl GpuTarget {
    /// An H100 SXM (sm_90, 132 SMs, 50 MiB of L2, 227 KiB of shared memory per block, 228 KiB
    /// per SM, 64K registers and 2048 threads per SM, clusters): the default target of host-side
    /// code generation and of tests, and the GPU coil's launch rules were measured on.
    pub fn h100() -> GpuTarget {
        GpuTarget {
            compute_capability: (9, 0),
            sm_count: 132,
            l2_bytes: 50 << 20,
            shared_per_block_optin: 227 << 10,
            shared_per_sm: 228 << 10,
            registers_per_sm: 64 << 10,
            max_threads_per_sm: 2048,
            clusters: true,
        }
    }

    /// An A100 SXM (sm_80, 108 SMs, 40 MiB of L2, 163 KiB of shared memory per block, 164 KiB
    /// per SM, 64K registers and 2048 threads per SM, no clusters).
    pub fn a100() -> GpuTarget {
        GpuTarget {
            compute_capability: (8, 0),
            sm_count: 108,
            l2_bytes: 40 << 20,
            shared_per_block_optin: 163 << 10,
            shared_per_sm: 164 << 10,
            registers_per_sm: 64 << 10,
            max_threads_per_sm: 2048,
            clusters: false,
        }
    }

    /// The compute capability as one number, `major * 10 + minor` (`90` for sm_90).
    pub fn arch(&self) -> u32 {
        self.compute_capability.0 * 10 + self.compute_capability.1
    }

    /// The tensor-core generation of the compute capability.
    ///
    /// ```
    /// use coil_ir::target::{GpuTarget, TensorCores};
    /// let sm_75 = GpuTarget { compute_capability: (7, 5), ..GpuTarget::a100() };
    /// assert_eq!(sm_75.tensor_cores(), TensorCores::Volta);
    /// ```
    pub fn tensor_cores(&self) -> TensorCores {
        match self.compute_capability.0 {
            0..=6 => TensorCores::None,
            7 => TensorCores::Volta,
            8 => TensorCores::Ampere,
            9 => TensorCores::Hopper,
            _ => TensorCores::Blackwell,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generations_follow_the_compute_capability() {
        let at = |major, minor| GpuTarget { compute_capability: (major, minor), ..GpuTarget::h100() };
        assert_eq!(at(6, 1).tensor_cores(), TensorCores::None);
        assert_eq!(at(8, 9).tensor_cores(), TensorCores::Ampere);
        assert_eq!(at(12, 0).tensor_cores(), TensorCores::Blackwell);
        assert_eq!((at(8, 6).arch(), at(10, 0).arch()), (86, 100));
        assert!(TensorCores::Hopper > TensorCores::Ampere);
    }
}
