//! What code generation and the cost models know about a GPU ([`GpuTarget`]).
//!
//! The runtime reads one from the device (`coil_runtime::cuda::CudaDevice::target`, from the
//! driver's device attributes) and hands it to the code generator's launch rules (blocks in
//! flight per SM, the L2 share a two-pass reduction may count on, occupancy hints, the
//! attention template's split of keys over SMs) and to the cost models. [`GpuTarget::h100`]
//! is the default where no GPU is at hand: host-side code generation (reading generated
//! kernels on a machine without a GPU) and tests.
//!
//! Besides the launch limits it carries what the peak rates follow from: the memory bus and
//! its clock ([`GpuTarget::memory_bandwidth`]) and the SM clock
//! ([`GpuTarget::tensor_flop_rate`]), as the driver reports them.

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
    /// Width of the memory bus, in bits (`CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH`).
    pub memory_bus_bits: u32,
    /// Peak memory clock, in kHz (`CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE`): data moves on both
    /// of its edges, so GDDR6X's reported clock is half its per-pin data rate.
    pub memory_clock_khz: u32,
    /// Peak SM clock, in kHz (`CU_DEVICE_ATTRIBUTE_CLOCK_RATE`: the highest boost clock).
    pub sm_clock_khz: u32,
}

impl GpuTarget {
    /// An H100 SXM5 80GB (sm_90, 132 SMs, 50 MiB of L2, 227 KiB of shared memory per block, 228
    /// KiB per SM, 64K registers and 2048 threads per SM, clusters; a 5120-bit HBM3 bus at 2619
    /// MHz and SMs at up to 1980 MHz, as the driver reports them): the default target of
    /// host-side code generation and of tests, and the GPU coil's launch rules were measured on.
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
            memory_bus_bits: 5120,
            memory_clock_khz: 2_619_000,
            sm_clock_khz: 1_980_000,
        }
    }

    /// An A100 SXM4 40GB (sm_80, 108 SMs, 40 MiB of L2, 163 KiB of shared memory per block, 164
    /// KiB per SM, 64K registers and 2048 threads per SM, no clusters; a 5120-bit HBM2 bus at
    /// 1215 MHz and SMs at up to 1410 MHz, as the driver reports them).
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
            memory_bus_bits: 5120,
            memory_clock_khz: 1_215_000,
            sm_clock_khz: 1_410_000,
        }
    }

    /// A V100 SXM2 (sm_70, 80 SMs, 6 MiB of L2, 96 KiB of shared memory per block and per SM,
    /// 64K registers and 2048 threads per SM, no clusters; a 4096-bit HBM2 bus at 877 MHz and
    /// SMs at up to 1530 MHz).
    pub fn v100() -> GpuTarget {
        GpuTarget {
            compute_capability: (7, 0),
            sm_count: 80,
            l2_bytes: 6 << 20,
            shared_per_block_optin: 96 << 10,
            shared_per_sm: 96 << 10,
            registers_per_sm: 64 << 10,
            max_threads_per_sm: 2048,
            clusters: false,
            memory_bus_bits: 4096,
            memory_clock_khz: 877_000,
            sm_clock_khz: 1_530_000,
        }
    }

    /// An RTX 4090 (sm_89, 128 SMs, 72 MiB of L2, 99 KiB of shared memory per block, 100 KiB
    /// per SM, 64K registers and 1536 threads per SM, no clusters; a 384-bit GDDR6X bus at
    /// 10501 MHz and SMs at up to 2520 MHz, as the driver reports them): a consumer card, whose
    /// bandwidth (1.008 TB/s) is not its generation's data-center part's.
    pub fn rtx_4090() -> GpuTarget {
        GpuTarget {
            compute_capability: (8, 9),
            sm_count: 128,
            l2_bytes: 72 << 20,
            shared_per_block_optin: 99 << 10,
            shared_per_sm: 100 << 10,
            registers_per_sm: 64 << 10,
            max_threads_per_sm: 1536,
            clusters: false,
            memory_bus_bits: 384,
            memory_clock_khz: 10_501_000,
            sm_clock_khz: 2_520_000,
        }
    }

    /// The data-center part of a tensor-core generation, whose clocks and bus stand in where a
    /// driver reports none ([`GpuTarget::with_missing_clocks_filled`]): [`GpuTarget::v100`]
    /// before Ampere, [`GpuTarget::a100`] for Ampere, [`GpuTarget::h100`] for Hopper and later.
    pub fn data_center_part(cores: TensorCores) -> GpuTarget {
        match cores {
            TensorCores::None | TensorCores::Volta => GpuTarget::v100(),
            TensorCores::Ampere => GpuTarget::a100(),
            TensorCores::Hopper | TensorCores::Blackwell => GpuTarget::h100(),
        }
    }

    /// This target with a bus width, memory clock or SM clock of zero (an attribute the driver
    /// does not report) taken from its generation's [`GpuTarget::data_center_part`], so the
    /// rates derived from them stay positive.
    ///
    /// ```
    /// use coil_ir::target::GpuTarget;
    /// let unknown = GpuTarget { memory_bus_bits: 0, memory_clock_khz: 0, ..GpuTarget::a100() };
    /// assert_eq!(unknown.with_missing_clocks_filled(), GpuTarget::a100());
    /// ```
    pub fn with_missing_clocks_filled(self) -> GpuTarget {
        let part = GpuTarget::data_center_part(self.tensor_cores());
        let or = |v: u32, fallback: u32| if v == 0 { fallback } else { v };
        GpuTarget {
            memory_bus_bits: or(self.memory_bus_bits, part.memory_bus_bits),
            memory_clock_khz: or(self.memory_clock_khz, part.memory_clock_khz),
            sm_clock_khz: or(self.sm_clock_khz, part.sm_clock_khz),
            ..self
        }
    }

    /// Theoretical peak memory bandwidth, bytes per second: `2 * memory clock * bus width / 8`
    /// (data on both clock edges). Copies reach ~90% of it ([`GpuTarget::h100`]: 3.35 TB/s, as
    /// NVIDIA publishes, against ~3.0 measured; [`GpuTarget::a100`] 1.555 TB/s).
    ///
    /// ```
    /// use coil_ir::target::GpuTarget;
    /// assert_eq!(GpuTarget::h100().memory_bandwidth(), 3.352_32e12);
    /// ```
    pub fn memory_bandwidth(&self) -> f64 {
        2.0 * (self.memory_clock_khz as f64 * 1e3) * self.memory_bus_bits as f64 / 8.0
    }

    /// Dense f16/bf16 flops (a multiply-add is two) one SM's tensor cores do per clock, f32
    /// accumulation; `0` without tensor cores. NVIDIA's published dense FP16 tensor rates
    /// divided by SMs and boost clock give it: V100 SXM2 125 TFLOP/s (80 SMs, 1530 MHz) and T4
    /// 65 (40, 1590): 1024; A100 312 (108, 1410): 2048; A10 125 (72, 1695), L4 121 (58, 2040)
    /// and RTX 4090 330 (128, 2520; f16 accumulation, GeForce cards halve it with f32's): 1024,
    /// the sm_86/sm_89 SM having half the A100 SM's tensor width; H100 SXM5 989 (132, 1830):
    /// 4096; B200 2250 (148 SMs, ~1.86 GHz implied): 8192; RTX 5090 (sm_120) 419 (170, 2407):
    /// 1024. Compute capabilities newer than these are taken as B200's.
    pub fn tensor_flops_per_sm_clock(&self) -> u32 {
        match self.compute_capability {
            (0..=6, _) => 0,
            (8, 0) => 2048,
            (7, _) | (8, _) | (12, _) => 1024,
            (9, _) => 4096,
            _ => 8192,
        }
    }

    /// Theoretical peak dense f16/bf16 tensor-core throughput, flops per second: SMs times SM
    /// clock times [`GpuTarget::tensor_flops_per_sm_clock`]. At the driver's highest clock,
    /// so above NVIDIA's figure where that is quoted at a lower clock: the H100 SXM5 gives
    /// 1070 TFLOP/s here (1980 MHz) against the published 989 (1830 MHz), the A100 312 as
    /// published. tf32 runs at half this rate.
    ///
    /// ```
    /// use coil_ir::target::GpuTarget;
    /// let a100 = GpuTarget::a100().tensor_flop_rate();
    /// assert!((a100 / 312e12 - 1.0).abs() < 0.01);
    /// ```
    pub fn tensor_flop_rate(&self) -> f64 {
        self.sm_count as f64 * (self.sm_clock_khz as f64 * 1e3) * self.tensor_flops_per_sm_clock() as f64
    }

    /// The compute capability as one number, `major * 10 + minor` (`90` for sm_90).
    pub fn arch(&self) -> u32 {
        self.compute_capability.0 * 10 + self.compute_capability.1
    }

    /// Whether kernels may be launched as programmatic dependents (sm_90 and newer): a kernel
    /// launched so starts while the one before it on the stream drains, and waits at
    /// `griddepcontrol.wait` (which generated kernels execute before touching memory) until
    /// that one has finished and its writes are visible.
    ///
    /// ```
    /// use coil_ir::target::GpuTarget;
    /// assert!(GpuTarget::h100().programmatic_launch());
    /// assert!(!GpuTarget::a100().programmatic_launch());
    /// ```
    pub fn programmatic_launch(&self) -> bool {
        self.compute_capability.0 >= 9
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

    fn close(got: f64, want: f64, tolerance: f64) -> bool {
        (got / want - 1.0).abs() <= tolerance
    }

    #[test]
    fn bandwidth_is_the_published_peak() {
        // NVIDIA's datasheets: H100 SXM5 3.35 TB/s, A100 40GB 1.555, V100 SXM2 0.9, RTX 4090 1.008.
        assert!(close(GpuTarget::h100().memory_bandwidth(), 3.35e12, 0.001));
        assert!(close(GpuTarget::a100().memory_bandwidth(), 1.555e12, 0.001));
        assert!(close(GpuTarget::v100().memory_bandwidth(), 0.9e12, 0.005));
        assert!(close(GpuTarget::rtx_4090().memory_bandwidth(), 1.008e12, 0.001));
    }

    #[test]
    fn tensor_rate_is_the_published_peak_at_the_published_clock() {
        // NVIDIA's dense FP16 tensor figures, at the clock each is quoted at.
        let at = |target: GpuTarget, mhz: u32| GpuTarget { sm_clock_khz: mhz * 1000, ..target }.tensor_flop_rate();
        assert!(close(at(GpuTarget::h100(), 1830), 989.4e12, 0.001));
        assert!(close(GpuTarget::a100().tensor_flop_rate(), 312e12, 0.001));
        assert!(close(GpuTarget::v100().tensor_flop_rate(), 125e12, 0.005));
        assert!(close(GpuTarget::rtx_4090().tensor_flop_rate(), 330.3e12, 0.001));
        // At the driver's highest clock the H100 is above its published figure.
        assert!(close(GpuTarget::h100().tensor_flop_rate(), 1070.5e12, 0.001));
        let pascal = GpuTarget { compute_capability: (6, 1), ..GpuTarget::v100() };
        assert_eq!(pascal.tensor_flop_rate(), 0.0);
    }

    #[test]
    fn missing_clocks_come_from_the_generations_data_center_part() {
        let unreported = |t: GpuTarget| GpuTarget { memory_bus_bits: 0, memory_clock_khz: 0, sm_clock_khz: 0, ..t };
        let filled = unreported(GpuTarget::rtx_4090()).with_missing_clocks_filled();
        assert_eq!(filled.memory_bandwidth(), GpuTarget::a100().memory_bandwidth());
        assert_eq!(filled.sm_clock_khz, GpuTarget::a100().sm_clock_khz);
        let blackwell = GpuTarget { compute_capability: (10, 0), ..unreported(GpuTarget::h100()) };
        assert_eq!(blackwell.with_missing_clocks_filled().memory_clock_khz, 2_619_000);
        let turing = GpuTarget { compute_capability: (7, 5), ..unreported(GpuTarget::h100()) };
        assert_eq!(turing.with_missing_clocks_filled().memory_bus_bits, 4096);
        // Reported values are kept.
        assert_eq!(GpuTarget::rtx_4090().with_missing_clocks_filled(), GpuTarget::rtx_4090());
    }
}
