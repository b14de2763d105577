//! Tests of the CUDA backend with hand-written CUDA C (the emitter is tested on its own).
//!
//! Tests that need a GPU print `skipped: no usable CUDA GPU (...)` and pass when there is none
//! ([`crate::testing::cuda_device`]), so CI (no GPU) passes and says what it did not check; on
//! the GPU machine they run for real. Every test that compiles uses
//! its own cache directory.

use super::blas::{self, DevOperand};
use super::compiler;
use super::loader::{self, CudaLib};
use super::memory::size_class;
use super::*;
use crate::cpu::gemm::{bmm_bytes, BmmSpec};
use crate::test_graphs::{buffer, fused, pointwise, tile};
use crate::Device;
use coil_codegen::cuda::{CudaKernel, Language};
use coil_ir::kernel::KernelKind;
use coil_ir::loops::{Activation, BiasOperand, LoopNode, StridedOperand};
use coil_ir::sym::Expr;
use coil_ir::{BinaryOp, DType, ErrorKind, TensorMeta};

/// A fresh directory, removed when dropped.
pub(super) struct TempDir(pub(super) PathBuf);

impl TempDir {
    pub(super) fn new(name: &str) -> TempDir {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        let dir = std::env::temp_dir().join(format!("coil-cuda-test-{name}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The first GPU, or `None` after printing why the test is skipped.
pub(super) fn gpu() -> Option<Arc<CudaDevice>> {
    crate::testing::cuda_device()
}

/// A device allocation holding `host`'s bytes.
fn uploaded(dev: &Arc<CudaDevice>, host: &[u8]) -> DeviceMemory {
    let mem = DeviceMemory::alloc(dev, host.len()).unwrap();
    // SAFETY: the allocation holds `host.len()` bytes.
    unsafe { memory::upload(dev, mem.ptr(), host).unwrap() };
    mem
}

/// Deterministic pseudo-random values in [-1, 1) (xorshift64*).
pub(super) fn randoms(seed: u64, n: usize) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9e3779b97f4a7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            (s.wrapping_mul(0x2545f4914f6cdd1d) >> 11) as f64 / (1u64 << 52) as f64 - 1.0
        })
        .collect()
}

pub(super) fn assert_close(got: &[f64], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol * (1.0 + w.abs()), "{what}: element {i}: {g} vs {w}");
    }
}

#[path = "dynamic_tests.rs"]
mod dynamic;

// ---------------------------------------------------------------- without a GPU

#[test]
fn missing_library_error_lists_the_places_searched() {
    let dirs = loader::search_dirs();
    let searched = loader::find(&["libcoil_no_such_library.so.1"], &dirs).unwrap_err();
    let all = searched.join("; ");
    assert!(all.contains("dynamic loader"), "{all}");
    assert!(all.contains("LD_LIBRARY_PATH"), "{all}");
    assert!(all.contains("/usr/local/cuda/targets/x86_64-linux/lib"), "{all}");
    assert!(all.contains("/usr/local/cuda/lib64"), "{all}");
    assert!(all.contains("/usr/local/nvidia/lib64"), "{all}");
    assert!(all.contains("$CUDA_HOME"), "{all}");
    if !cuda_available() {
        // The real thing: every entry point says why, and nothing panicked on the way.
        let e = CudaDevice::get(0).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Runtime);
        assert!(e.message.contains("CUDA is not available"), "{}", e.message);
        if loader::require(CudaLib::Driver).is_err() {
            assert!(e.message.contains("libcuda.so.1"), "{}", e.message);
            assert!(e.message.contains("Searched:"), "{}", e.message);
            assert!(e.message.contains("/usr/local/cuda/targets/x86_64-linux/lib"), "{}", e.message);
        }
        assert!(cuda_status().is_err());
    }
}

#[test]
fn default_device_follows_cuda_availability() {
    let want = if cuda_available() { Device::Cuda(0) } else { Device::Cpu };
    assert_eq!(Device::default(), want);
    assert_eq!(Device::Cuda(0).to_string(), "cuda:0");
    assert!(Device::Cuda(3).is_cuda() && !Device::Cpu.is_cuda());
}

#[test]
fn size_classes_round_up() {
    assert_eq!(size_class(0), 0);
    assert_eq!(size_class(1), 512);
    assert_eq!(size_class(512), 512);
    assert_eq!(size_class(513), 1024);
    assert_eq!(size_class(1 << 20), 1 << 20);
    // Large blocks are cut from shared segments to the 512-byte multiple.
    assert_eq!(size_class((1 << 20) + 1), (1 << 20) + 512);
    assert_eq!(size_class(5 << 20), 5 << 20);
}

#[test]
fn cuda_types_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<CudaCompiledGraph>();
    send_sync::<CudaDevice>();
    send_sync::<CudaBuffer>();
}

#[test]
fn cache_keys_depend_on_source_arch_and_nvrtc() {
    let k = compiler::cache_key("src", "sm_90", (13, 0));
    assert_eq!(k.len(), 32);
    assert_eq!(k, compiler::cache_key("src", "sm_90", (13, 0)));
    assert_ne!(k, compiler::cache_key("src", "sm_80", (13, 0)));
    assert_ne!(k, compiler::cache_key("src", "sm_90", (13, 1)));
    assert_ne!(k, compiler::cache_key("src2", "sm_90", (13, 0)));
}

/// The bus, clocks and rates read from the device: positive everywhere, and on an H100 (SXM5
/// 3.35 TB/s, PCIe 2.0, NVL 3.9) its bandwidth and tensor throughput.
#[test]
fn the_target_read_from_the_device_has_its_memory_and_clocks() {
    let Some(dev) = gpu() else { return };
    let target = dev.target();
    let (bandwidth, flops) = (target.memory_bandwidth(), target.tensor_flop_rate());
    println!("{}: {target:?}, {:.3} TB/s, {:.0} TFLOP/s", dev.name(), bandwidth / 1e12, flops / 1e12);
    assert!(target.memory_bus_bits > 0 && target.memory_clock_khz > 0 && target.sm_clock_khz > 0, "{target:?}");
    if dev.name().contains("H100") {
        assert!((1.5e12..5e12).contains(&bandwidth), "{} reads {bandwidth} B/s", dev.name());
        assert!((6e14..1.2e15).contains(&flops), "{} reads {flops} FLOP/s", dev.name());
    }
}

// ---------------------------------------------------------------- memory

#[test]
fn buffers_round_trip() {
    let Some(dev) = gpu() else { return };
    let bufs = [
        Buffer::from_vec(vec![1.5f32, -2.0, 3.25], vec![3]),
        Buffer::from_vec(vec![half::bf16::from_f32(0.5), half::bf16::from_f32(-7.0)], vec![2, 1]),
        Buffer::from_vec(vec![true, false, true, true], vec![2, 2]),
        Buffer::from_vec(vec![i64::MIN, 0, i64::MAX], vec![3]),
        Buffer::from_vec(Vec::<f32>::new(), vec![0, 4]),
    ];
    for b in &bufs {
        let d = CudaBuffer::from_host(&dev, b).unwrap();
        assert_eq!(d.meta(), &b.meta());
        assert_eq!(&d.to_host().unwrap(), b);
        assert_eq!(&d.try_clone().unwrap().to_host().unwrap(), b);
    }
    let z = CudaBuffer::zeros(&dev, TensorMeta::new(vec![5], DType::I32)).unwrap();
    assert_eq!(z.to_host().unwrap().to_vec::<i32>(), vec![0; 5]);
}

#[test]
fn the_allocator_reuses_freed_blocks() {
    let Some(dev) = gpu() else { return };
    // An odd size no other test uses, so parallel tests do not take our block.
    let bytes = 777 * 1024 + 3;
    drop(DeviceMemory::alloc(&dev, bytes).unwrap());
    let before = dev.allocator.stats();
    assert!(before.cached_bytes >= size_class(bytes));
    let again = DeviceMemory::alloc(&dev, bytes).unwrap();
    let after = dev.allocator.stats();
    assert_eq!(after.driver_allocations, before.driver_allocations, "served from the cache");
    assert!(after.cache_hits > before.cache_hits);
    drop(again);
    // Far more than the GPU has: an error, not a panic or an abort.
    let e = DeviceMemory::alloc(&dev, 1 << 50).unwrap_err();
    assert!(e.message.contains("out of memory"), "{}", e.message);
}

/// Blocks above 1 MiB share driver segments: a few 2.4 MB blocks take one segment and count
/// their own bytes, sit next to each other, are readable and writable, and merge back.
#[test]
fn large_blocks_share_segments() {
    let Some(dev) = gpu() else { return };
    let bytes = 768 * 768 * 4 + 100; // a GPT-2 weight, plus an odd tail
    let before = dev.allocator.stats();
    let blocks: Vec<DeviceMemory> = (0..4).map(|_| DeviceMemory::alloc(&dev, bytes).unwrap()).collect();
    let during = dev.allocator.stats();
    assert_eq!(during.in_use_bytes - before.in_use_bytes, 4 * size_class(bytes), "each counts its own bytes");
    assert!(during.driver_allocations - before.driver_allocations <= 2, "{before:?} -> {during:?}");
    for (i, b) in blocks.iter().enumerate() {
        let data =
            CudaBuffer::from_bytes(&dev, TensorMeta::new(vec![bytes], DType::U8), &vec![i as u8; bytes]).unwrap();
        // SAFETY: both hold `bytes` bytes; distinct allocations.
        unsafe { memory::copy_device(&dev, b.ptr(), data.ptr(), bytes) }.unwrap();
    }
    for (i, b) in blocks.iter().enumerate() {
        // SAFETY: the block holds `bytes` bytes, written above.
        let back = unsafe { memory::download(&dev, b.ptr(), bytes) }.unwrap();
        assert!(back.iter().all(|&x| x == i as u8), "block {i} was overwritten by a neighbour");
    }
    drop(blocks);
    // The four merged: one block of all their bytes comes from the cache.
    let cached = dev.allocator.stats();
    let merged = DeviceMemory::alloc(&dev, 4 * size_class(bytes)).unwrap();
    assert_eq!(dev.allocator.stats().driver_allocations, cached.driver_allocations);
    drop(merged);
}

// ---------------------------------------------------------------- compiled graphs

fn module(source: &str, name: &str, grid: u32) -> CudaModule {
    CudaModule {
        source: source.into(),
        kernels: vec![CudaKernel {
            name: name.into(),
            launch: Launch { grid, block: 256, shared_bytes: 0, per_block: 256, max_grid: 0, cluster: 1 },
        }],
        language: Language::CudaC,
    }
}

/// A hand-written kernel (independent of the code generator): `out = in0 + in1` over 1000 f32.
const ADD_CU: &str = include_str!("../../testdata/add.cu");

/// `buf2 = arg0 + arg1` over 1000 f32; outputs `(buf2, arg0, buf2)`.
fn add_graph(dev: &Arc<CudaDevice>, dir: &Path, source: &str) -> Result<CudaCompiledGraph> {
    let f = DType::F32;
    let program = LoopProgram {
        symbols: vec![],
        data_checks: vec![],
        buffers: vec![buffer("arg0", &[1000], f), buffer("arg1", &[1000], f), buffer("buf2", &[1000], f)],
        inputs: vec![BufferId(0), BufferId(1)],
        outputs: vec![BufferId(2), BufferId(0), BufferId(2)],
        nodes: vec![pointwise(2, 1000, &[0, 1], BinaryOp::Add, f)],
    };
    let schedule = Schedule {
        kernels: vec![fused("poi_fused_add_0", KernelKind::Pointwise, 0, 1000, &[2])],
        ..Default::default()
    };
    let k =
        tile("poi_fused_add_0", 1000, &[("in_ptr0", 0, f, false), ("in_ptr1", 1, f, false), ("out_ptr0", 2, f, true)]);
    CudaCompiledGraph::new_in(
        dev.clone(),
        program,
        schedule,
        vec![Some(k)],
        &[module(source, "poi_fused_add_0", 4)],
        dir,
    )
}

#[test]
fn hand_written_kernel_runs_and_the_second_build_hits_the_cache() {
    let Some(dev) = gpu() else { return };
    let dir = TempDir::new("add");
    let g = add_graph(&dev, &dir.0, ADD_CU).unwrap();
    assert!(!g.cache_hit() && g.compile_seconds() > 0.0);
    let cubin = g.cubin_path().unwrap().to_path_buf();
    assert!(cubin.starts_with(dir.0.join("cuda")) && cubin.to_string_lossy().ends_with(".cubin.entry"));
    assert!(g.source_path().unwrap().exists());
    let attrs = g.kernel_attributes();
    assert_eq!(attrs.len(), 1);
    assert_eq!((attrs[0].name.as_str(), attrs[0].grid, attrs[0].block), ("poi_fused_add_0", 4, 256));
    assert!(attrs[0].registers > 0);
    // the unit's own NVRTC and load times (NVRTC takes milliseconds even for this kernel)
    assert!(attrs[0].compile_us > 1000 && attrs[0].load_us > 0, "{:?}", attrs[0]);

    let a: Vec<f32> = (0..1000).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..1000).map(|i| 0.5 * i as f32).collect();
    let (ha, hb) = (Buffer::from_vec(a.clone(), vec![1000]), Buffer::from_vec(b.clone(), vec![1000]));
    let out = g.run_host(&[&ha, &hb]).unwrap();
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    assert_eq!(out[0].to_vec::<f32>(), want);
    assert_eq!(out[1], ha);
    assert_eq!(out[2].to_vec::<f32>(), want);

    let again = add_graph(&dev, &dir.0, ADD_CU).unwrap();
    assert!(again.cache_hit() && again.compile_seconds() == 0.0);
    assert_eq!(again.kernel_attributes()[0].compile_us, 0);
    assert_eq!(again.run_host(&[&ha, &hb]).unwrap()[0].to_vec::<f32>(), want);

    // Device time per run, from events.
    let (da, db) = (CudaBuffer::from_host(&dev, &ha).unwrap(), CudaBuffer::from_host(&dev, &hb).unwrap());
    let times = again.time_runs(&[&da, &db], 2, 5).unwrap();
    assert_eq!(times.len(), 5);
    assert!(times.iter().all(|&t| t > 0.0 && t < 1e6), "{times:?}");

    // Damaged entries, and another unit's (a kernel of the same name that multiplies), are
    // rebuilt with the reason kept, and never loaded.
    let good = std::fs::read(&cubin).unwrap();
    let mul = add_graph(&dev, &dir.0, &ADD_CU.replace("in_ptr0[x] + in_ptr1[x]", "in_ptr0[x] * in_ptr1[x]")).unwrap();
    let other = std::fs::read(mul.cubin_path().unwrap()).unwrap();
    let mut flipped = good.clone();
    let middle = good.len() / 2;
    flipped[middle] ^= 0x40;
    for (what, bytes, why) in [
        ("garbage", b"\x7fELF garbage".to_vec(), "no entry header"),
        ("truncated", good[..good.len() - 100].to_vec(), "payload bytes"),
        ("a flipped byte", flipped, "checksum mismatch"),
        ("another unit's entry", other, "built for key"),
    ] {
        std::fs::write(&cubin, bytes).unwrap();
        let rebuilt = add_graph(&dev, &dir.0, ADD_CU).unwrap();
        assert!(!rebuilt.cache_hit(), "{what}");
        assert!(rebuilt.cache_rebuilt_because().is_some_and(|r| r.contains(why)), "{what}");
        assert_eq!(rebuilt.run_host(&[&ha, &hb]).unwrap()[0].to_vec::<f32>(), want, "{what}");
    }
    let rebuilt = add_graph(&dev, &dir.0, ADD_CU).unwrap();
    assert!(rebuilt.cache_hit() && rebuilt.cache_rebuilt_because().is_none());
    // Wrong inputs are errors.
    assert_eq!(rebuilt.run(&[&da]).unwrap_err().kind, ErrorKind::Value);
}

#[test]
fn compile_errors_carry_the_nvrtc_log_and_keep_the_source() {
    let Some(dev) = gpu() else { return };
    let dir = TempDir::new("bad");
    let bad = ADD_CU.replace("in_ptr1[x];", "in_ptr1[x] + undefined_thing;");
    let e = add_graph(&dev, &dir.0, &bad).unwrap_err();
    assert!(e.message.contains("NVRTC failed"), "{}", e.message);
    assert!(e.message.contains("undefined_thing"), "{}", e.message);
    let kept: Vec<_> = std::fs::read_dir(dir.0.join("cuda")).unwrap().flatten().map(|e| e.path()).collect();
    assert!(kept.iter().any(|p| p.extension().is_some_and(|x| x == "cu")), "{kept:?}");
}

#[test]
fn out_of_bounds_index_is_an_error_naming_the_kernel() {
    let Some(dev) = gpu() else { return };
    let dir = TempDir::new("oob");
    let cu = include_str!("../../testdata/index_select_oob.cu");
    let program = LoopProgram {
        symbols: vec![],
        data_checks: vec![],
        buffers: vec![
            buffer("arg0", &[5], DType::F32),
            buffer("arg1", &[3], DType::I64),
            buffer("buf2", &[3], DType::F32),
        ],
        inputs: vec![BufferId(0), BufferId(1)],
        outputs: vec![BufferId(2)],
        nodes: vec![pointwise(2, 3, &[0], BinaryOp::Add, DType::F32)],
    };
    let name = "poi_fused_index_select_0";
    let schedule = Schedule { kernels: vec![fused(name, KernelKind::Pointwise, 0, 3, &[2])], ..Default::default() };
    let args =
        [("in_ptr0", 0, DType::F32, false), ("in_ptr1", 1, DType::I64, false), ("out_ptr0", 2, DType::F32, true)];
    let g = CudaCompiledGraph::new_in(
        dev,
        program,
        schedule,
        vec![Some(tile(name, 3, &args))],
        &[module(cu, name, 1)],
        &dir.0,
    )
    .unwrap();
    let table = Buffer::from_vec(vec![10f32, 11., 12., 13., 14.], vec![5]);
    let ok = g.run_host(&[&table, &Buffer::from_vec(vec![4i64, 0, 2], vec![3])]).unwrap();
    assert_eq!(ok[0].to_vec::<f32>(), vec![14., 10., 12.]);
    let e = g.run_host(&[&table, &Buffer::from_vec(vec![1i64, 7, 2], vec![3])]).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Value);
    assert_eq!(e.op.as_deref(), Some(name));
    assert_eq!(e.message, "index 7 is out of bounds for dim of size 5");
    // The status is per run: the next good run succeeds.
    assert!(g.run_host(&[&table, &Buffer::from_vec(vec![4i64, 0, 2], vec![3])]).is_ok());
}

// ---------------------------------------------------------------- matrix products

fn operand(offset: usize, batch_strides: Vec<usize>, row_stride: usize, col_stride: usize) -> StridedOperand<usize> {
    StridedOperand { buffer: BufferId(0), offset, batch_strides, row_stride, col_stride }
}

/// One product on the GPU (`blas::bmm`) against the CPU's `bmm_bytes` on the same bytes.
#[allow(clippy::too_many_arguments)]
fn check_bmm(
    dev: &Arc<CudaDevice>,
    dtype: DType,
    batch: &[usize],
    mnk: (usize, usize, usize),
    a: StridedOperand<usize>,
    a_len: usize,
    b: StridedOperand<usize>,
    b_len: usize,
    bias: Option<(BiasOperand<usize>, usize)>,
    what: &str,
) {
    check_bmm_act(dev, dtype, batch, mnk, a, a_len, b, b_len, bias, None, what)
}

/// [`check_bmm`] with an activation epilogue.
#[allow(clippy::too_many_arguments)]
fn check_bmm_act(
    dev: &Arc<CudaDevice>,
    dtype: DType,
    batch: &[usize],
    (m, n, k): (usize, usize, usize),
    a: StridedOperand<usize>,
    a_len: usize,
    b: StridedOperand<usize>,
    b_len: usize,
    bias: Option<(BiasOperand<usize>, usize)>,
    activation: Option<Activation>,
    what: &str,
) {
    let count: usize = batch.iter().product();
    // Integers in [-8, 8), floats in [-1, 1) (in [-2, 2) under an activation, so that the sums
    // reach both sides of the gelu's bend).
    let scale = if !dtype.is_float() {
        8.0
    } else if activation.is_some() {
        2.0
    } else {
        1.0
    };
    let bytes_of = |seed: u64, len: usize| {
        let xs: Vec<f64> = randoms(seed, len).iter().map(|x| x * scale).collect();
        HostData::from_f64_slice(dtype, &xs).to_bytes()
    };
    let (ha, hb) = (bytes_of(1, a_len), bytes_of(2, b_len));
    let hbias = bias.as_ref().map_or(Vec::new(), |(_, len)| bytes_of(3, *len));
    let spec = BmmSpec {
        a,
        b,
        batch: batch.to_vec(),
        m,
        n,
        k,
        bias: bias.as_ref().map(|(x, _)| *x),
        activation,
        activation_grad: None,
    };
    let out_bytes = count * m * n * dtype.size_bytes();
    let mut want = vec![0u64; out_bytes.div_ceil(8)];
    let want = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut want)[..out_bytes];
    let (wa, wb, wbias) = (words(&ha), words(&hb), words(&hbias));
    bmm_bytes(&spec, dtype, view(&wa, ha.len()), view(&wb, hb.len()), view(&wbias, hbias.len()), want).unwrap();

    let (da, db, dbias) = (uploaded(dev, &ha), uploaded(dev, &hb), uploaded(dev, &hbias));
    let out = DeviceMemory::alloc(dev, out_bytes).unwrap();
    let op = |m: &DeviceMemory| DevOperand { ptr: m.ptr(), bytes: m.bytes() };
    blas::bmm(dev, &spec, dtype, dtype, op(&da), op(&db), bias.as_ref().map(|_| op(&dbias)), None, None, op(&out))
        .unwrap();
    // SAFETY: the allocation holds `out_bytes` bytes.
    let got = unsafe { memory::download(dev, out.ptr(), out_bytes).unwrap() };
    let tol = match dtype {
        DType::F32 => 1e-5,
        DType::BF16 | DType::F16 => 1e-2,
        // cuBLASLt's f64 gelu differs from the CPU's in the last bits (seen: 2e-10 relative).
        DType::F64 => 1e-9,
        _ => 0.0,
    };
    let f = |b: &[u8]| HostData::from_bytes(dtype, b).unwrap().to_f64_vec();
    assert_close(&f(&got), &f(want), tol, &format!("{what} ({dtype})"));
}

fn words(bytes: &[u8]) -> Vec<u64> {
    let mut w = vec![0u64; bytes.len().div_ceil(8)];
    bytemuck::cast_slice_mut::<u64, u8>(&mut w)[..bytes.len()].copy_from_slice(bytes);
    w
}

fn view(w: &[u64], len: usize) -> &[u8] {
    &bytemuck::cast_slice::<u64, u8>(w)[..len]
}

#[test]
fn bmm_matches_the_cpu_for_layouts_bias_and_dtypes() {
    let Some(dev) = gpu() else { return };
    let (m, n, k) = (33, 20, 17);
    for dtype in [DType::F32, DType::BF16, DType::F16, DType::I32] {
        let host_before = blas::HOST_PRODUCTS.load(std::sync::atomic::Ordering::Relaxed);
        let contiguous_a = operand(0, vec![m * k], k, 1);
        let contiguous_b = operand(0, vec![k * n], n, 1);
        let bias = (BiasOperand { buffer: BufferId(2), offset: 0, stride: 1 }, n);
        check_bmm(
            &dev,
            dtype,
            &[2],
            (m, n, k),
            contiguous_a.clone(),
            2 * m * k,
            contiguous_b.clone(),
            2 * k * n,
            None,
            "plain",
        );
        check_bmm(
            &dev,
            dtype,
            &[2],
            (m, n, k),
            contiguous_a.clone(),
            2 * m * k,
            contiguous_b.clone(),
            2 * k * n,
            Some(bias),
            "bias",
        );
        // a transposed (stored [2, k, m]), b broadcast over the batch (stride 0).
        let at = operand(0, vec![m * k], 1, m);
        check_bmm(
            &dev,
            dtype,
            &[2],
            (m, n, k),
            at.clone(),
            2 * m * k,
            operand(0, vec![0], n, 1),
            k * n,
            None,
            "transposed, broadcast",
        );
        // b transposed (stored [n, k]), a strided bias with an offset (gathered first).
        let bt = operand(0, vec![0], 1, k);
        let odd_bias = (BiasOperand { buffer: BufferId(2), offset: 1, stride: 2 }, 2 * n + 1);
        check_bmm(
            &dev,
            dtype,
            &[2],
            (m, n, k),
            contiguous_a.clone(),
            2 * m * k,
            bt,
            n * k,
            Some(odd_bias),
            "b transposed, strided bias",
        );
        // Not expressible: every other column of a wider matrix, at an odd offset.
        let every_other = operand(1, vec![2 * m * k], 2 * k, 2);
        check_bmm(
            &dev,
            dtype,
            &[2],
            (m, n, k),
            every_other,
            4 * m * k + 1,
            contiguous_b.clone(),
            2 * k * n,
            None,
            "gathered",
        );
        // Two batch dims that do not collapse (a broadcast over the outer one).
        let a2 = operand(0, vec![0, m * k], k, 1);
        let b2 = operand(0, vec![3 * k * n, k * n], n, 1);
        check_bmm(&dev, dtype, &[2, 3], (m, n, k), a2, 3 * m * k, b2, 6 * k * n, None, "batch [2, 3]");
        // k = 0: the bias alone.
        check_bmm(
            &dev,
            dtype,
            &[2],
            (m, n, 0),
            operand(0, vec![0], 0, 1),
            1,
            operand(0, vec![0], 0, 1),
            1,
            Some(bias),
            "k = 0",
        );
        // Floats all went through cuBLASLt (integers through the host, by design).
        let host_products = blas::HOST_PRODUCTS.load(std::sync::atomic::Ordering::Relaxed) - host_before;
        assert_eq!(host_products == 0, dtype.is_float(), "{dtype}: {host_products} products on the host");
    }
    // A view outside its buffer is an error before anything runs.
    let d = DeviceMemory::alloc(&dev, 64).unwrap();
    let op = DevOperand { ptr: d.ptr(), bytes: 64 };
    let (a, b) = (operand(0, vec![], 4, 1), operand(0, vec![], 4, 1));
    let spec = BmmSpec { a, b, batch: vec![], m: 8, n: 4, k: 4, bias: None, activation: None, activation_grad: None };
    let out = DeviceMemory::alloc(&dev, 128).unwrap();
    let e = blas::bmm(
        &dev,
        &spec,
        DType::F32,
        DType::F32,
        op,
        op,
        None,
        None,
        None,
        DevOperand { ptr: out.ptr(), bytes: 128 },
    )
    .unwrap_err();
    assert!(e.message.contains("reaches element"), "{}", e.message);
}

/// With the GEMM autotuner on, the first call of a problem times cuBLASLt's candidates, caches
/// the choice on disk, and the product (run by the chosen algorithm) still matches the CPU; with
/// it off nothing is cached.
#[test]
fn gemm_autotune_caches_a_choice_and_keeps_the_result() {
    let Some(dev) = gpu() else { return };
    let dir = std::env::temp_dir().join(format!("coil-gemm-autotune-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let config = |on: bool| {
        let base = coil_ir::config::current();
        let tuning = coil_ir::config::Tuning { gemm_autotune: on, ..base.tuning.clone() };
        coil_ir::config::Config { cache_dir: dir.clone(), tuning, ..(*base).clone() }
    };
    let entries = || std::fs::read_dir(dir.join("gemm")).map_or(0, |d| d.count());
    // A problem no other test uses (k = 200), so this process has not chosen for it yet.
    let (m, n, k) = (256, 192, 200);
    let product = |what| {
        let (a, b) = (operand(0, vec![0], k, 1), operand(0, vec![0], n, 1));
        check_bmm_act(&dev, DType::BF16, &[1], (m, n, k), a, m * k, b, k * n, None, None, what);
    };
    coil_ir::config::with_config(config(false), || product("autotune off"));
    assert_eq!(entries(), 0, "nothing is cached with the autotuner off");
    coil_ir::config::with_config(config(true), || product("autotune on"));
    assert_eq!(entries(), 1, "one choice cached for one problem");
    let entry = std::fs::read_dir(dir.join("gemm")).unwrap().next().unwrap().unwrap().path();
    let key = entry.file_name().unwrap().to_string_lossy().split('.').next().unwrap().to_string();
    let chosen = blas_choice::read_choice(&dir, &key).expect("a valid choice entry");
    assert!(chosen < blas_choice::CANDIDATES);
    // A second call of the problem uses the choice (no new entry) and agrees again.
    coil_ir::config::with_config(config(true), || product("autotune on, chosen"));
    assert_eq!(entries(), 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The gelu_tanh epilogue (`CUBLASLT_EPILOGUE_GELU_BIAS` / `_GELU`, or the product followed by
/// the built-in activation kernel where cuBLASLt has no algorithm with it) against the CPU,
/// which computes bias then gelu in f32 and rounds once.
#[test]
fn bmm_gelu_epilogue_matches_the_cpu() {
    let Some(dev) = gpu() else { return };
    let (m, n, k) = (33, 24, 17);
    let gelu = Some(Activation::GeluTanh);
    let counter = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    for dtype in [DType::F32, DType::BF16, DType::F16, DType::F64] {
        let (host_before, kernels_before) = (counter(&blas::HOST_PRODUCTS), counter(&blas::ACTIVATION_KERNELS));
        let a = operand(0, vec![m * k], k, 1);
        let b = operand(0, vec![0], 1, k); // a weight [n, k] used transposed, as linear does
        let bias = (BiasOperand { buffer: BufferId(2), offset: 0, stride: 1 }, n);
        let args = |a: &StridedOperand<usize>, b: &StridedOperand<usize>| (a.clone(), 2 * m * k, b.clone(), n * k);
        let (pa, la, pb, lb) = args(&a, &b);
        check_bmm_act(&dev, dtype, &[2], (m, n, k), pa, la, pb, lb, Some(bias), gelu, "linear + gelu");
        let lib_kernels = counter(&blas::ACTIVATION_KERNELS) - kernels_before;
        let (pa, la, pb, lb) = args(&a, &b);
        check_bmm_act(&dev, dtype, &[2], (m, n, k), pa, la, pb, lb, None, gelu, "no bias + gelu");
        let odd_bias = (BiasOperand { buffer: BufferId(2), offset: 1, stride: 2 }, 2 * n + 1);
        let (pa, la, pb, lb) = args(&a, &b);
        check_bmm_act(&dev, dtype, &[2], (m, n, k), pa, la, pb, lb, Some(odd_bias), gelu, "strided bias + gelu");
        let every_other = operand(1, vec![2 * m * k], 2 * k, 2);
        let (_, _, pb, lb) = args(&a, &b);
        check_bmm_act(&dev, dtype, &[2], (m, n, k), every_other, 4 * m * k + 1, pb, lb, Some(bias), gelu, "gathered");
        let zero = operand(0, vec![0], 0, 1);
        check_bmm_act(&dev, dtype, &[2], (m, n, 0), zero.clone(), 1, zero, 1, Some(bias), gelu, "k = 0");
        let kernels = counter(&blas::ACTIVATION_KERNELS) - kernels_before;
        eprintln!("{dtype}: {kernels} of 4 products with k > 0 applied the gelu in a follow-up kernel");
        assert_eq!(counter(&blas::HOST_PRODUCTS), host_before, "{dtype}: no product went to the host");
        // The MLP's case (bf16 / f16 / f32 linear + gelu) must be one cuBLASLt call.
        if dtype != DType::F64 {
            assert_eq!(lib_kernels, 0, "{dtype}: cuBLASLt did not take CUBLASLT_EPILOGUE_GELU_BIAS");
        }
    }
    // The follow-up kernel on its own, each dtype, against the CPU's definition.
    for dtype in [DType::F32, DType::BF16, DType::F16, DType::F64] {
        let xs: Vec<f64> = randoms(9, 1000).iter().map(|x| x * 4.0).collect();
        let host = HostData::from_f64_slice(dtype, &xs);
        let mem = DeviceMemory::alloc(&dev, host.to_bytes().len()).unwrap();
        // SAFETY: the allocation holds the bytes uploaded, 1000 elements of `dtype`.
        unsafe {
            memory::upload(&dev, mem.ptr(), &host.to_bytes()).unwrap();
            blas::apply_activation(&dev, Activation::GeluTanh, dtype, mem.ptr(), 1000).unwrap();
        }
        // SAFETY: as above.
        let got = unsafe { memory::download(&dev, mem.ptr(), mem.bytes()).unwrap() };
        let got = HostData::from_bytes(dtype, &got[..host.to_bytes().len()]).unwrap().to_f64_vec();
        let want: Vec<f64> = host
            .to_f64_vec()
            .iter()
            .map(|&x| match dtype {
                DType::F64 => Activation::GeluTanh.apply_f64(x),
                _ => Activation::GeluTanh.apply_f32(x as f32) as f64,
            })
            .collect();
        let want = HostData::from_f64_slice(dtype, &want).to_f64_vec();
        let tol = if dtype == DType::F64 { 1e-12 } else { 1e-5 };
        // Half types: one rounding of nearly equal f32 values may differ in the last bit.
        let tol = if matches!(dtype, DType::BF16 | DType::F16) { 1e-2 } else { tol };
        assert_close(&got, &want, tol, &format!("activation kernel ({dtype})"));
    }
}

/// The gelu_tanh gradient epilogue (`CUBLASLT_EPILOGUE_DGELU` reading the saved input, for f16
/// and bf16; or the product followed by the built-in gradient kernel, for f32 and f64, where
/// cuBLASLt's derivative is off by up to 1e-4, and where cuBLASLt has no algorithm) against the
/// CPU (`bmm_bytes_grad`: the product times the derivative in f32, rounded once). `n = 20` is no
/// multiple of 8, which the epilogue's saved input needs: the kernel path.
#[test]
fn bmm_gelu_grad_epilogue_matches_the_cpu() {
    let Some(dev) = gpu() else { return };
    let counter = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    for dtype in [DType::F32, DType::BF16, DType::F16, DType::F64] {
        for (m, n, k) in [(33, 24, 17), (33, 20, 17), (64, 48, 0)] {
            let kernels_before = counter(&blas::ACTIVATION_KERNELS);
            let a = operand(0, vec![m * k], k, 1);
            let b = operand(0, vec![0], n, 1); // a weight [k, n] used as is, as dY @ W does
            let spec = BmmSpec {
                a,
                b,
                batch: vec![2],
                m,
                n,
                k,
                bias: None,
                activation: None,
                activation_grad: Some(Activation::GeluTanh),
            };
            let bytes_of = |seed: u64, len: usize, scale: f64| {
                let xs: Vec<f64> = randoms(seed, len).iter().map(|x| x * scale).collect();
                HostData::from_f64_slice(dtype, &xs).to_bytes()
            };
            let (ha, hb, haux) =
                (bytes_of(1, (2 * m * k).max(1), 1.0), bytes_of(2, (k * n).max(1), 1.0), bytes_of(3, 2 * m * n, 3.0));
            let out_bytes = 2 * m * n * dtype.size_bytes();
            let mut want = vec![0u8; out_bytes];
            let (wa, wb, waux) = (words(&ha), words(&hb), words(&haux));
            crate::cpu::gemm::bmm_bytes_grad(
                &spec,
                dtype,
                view(&wa, ha.len()),
                view(&wb, hb.len()),
                view(&waux, haux.len()),
                &mut want,
            )
            .unwrap();
            let (da, db, daux) = (uploaded(&dev, &ha), uploaded(&dev, &hb), uploaded(&dev, &haux));
            let out = DeviceMemory::alloc(&dev, out_bytes).unwrap();
            let op = |m: &DeviceMemory| DevOperand { ptr: m.ptr(), bytes: m.bytes() };
            blas::bmm(&dev, &spec, dtype, dtype, op(&da), op(&db), None, Some(op(&daux)), None, op(&out)).unwrap();
            // SAFETY: the allocation holds `out_bytes` bytes.
            let got = unsafe { memory::download(&dev, out.ptr(), out_bytes).unwrap() };
            let f = |b: &[u8]| HostData::from_bytes(dtype, b).unwrap().to_f64_vec();
            let tol = match dtype {
                DType::F32 => 1e-5,
                DType::F64 => 1e-9,
                _ => 1e-2,
            };
            let kernel = counter(&blas::ACTIVATION_KERNELS) > kernels_before;
            if dtype.size_bytes() == 2 && n % 8 == 0 && k > 0 {
                assert!(!kernel, "{dtype} {m}x{n}x{k}: cuBLASLt did not take CUBLASLT_EPILOGUE_DGELU");
            }
            assert_close(&f(&got), &f(&want), tol, &format!("dgelu {m}x{n}x{k} ({dtype})"));
            eprintln!(
                "{dtype} {m}x{n}x{k}: the gradient {}",
                if kernel { "in a follow-up kernel" } else { "in cuBLASLt" }
            );
        }
    }
}

/// A gelu_tanh product that also writes its activation's input (`CUBLASLT_EPILOGUE_GELU_AUX_BIAS`
/// / `GELU_AUX`; the product into the saved buffer, a copy and the activation kernel where
/// cuBLASLt has no algorithm: `n = 20` is no multiple of 8, `k = 0` an empty sum) against the
/// CPU (`bmm_bytes_saving`), with and without a bias.
#[test]
fn bmm_gelu_saving_its_input_matches_the_cpu() {
    let Some(dev) = gpu() else { return };
    let counter = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        for (m, n, k) in [(33, 24, 17), (33, 20, 17), (64, 48, 0)] {
            for with_bias in [true, false] {
                let kernels_before = counter(&blas::ACTIVATION_KERNELS);
                let a = operand(0, vec![m * k], k, 1);
                let b = operand(0, vec![0], 1, k); // a weight [n, k] used transposed, as linear does
                let bias = with_bias.then_some(BiasOperand { buffer: BufferId(2), offset: 0, stride: 1 });
                let spec = BmmSpec {
                    a,
                    b,
                    batch: vec![2],
                    m,
                    n,
                    k,
                    bias,
                    activation: Some(Activation::GeluTanh),
                    activation_grad: None,
                };
                let bytes_of = |seed: u64, len: usize| {
                    let xs: Vec<f64> = randoms(seed, len).iter().map(|x| x * 2.0).collect();
                    HostData::from_f64_slice(dtype, &xs).to_bytes()
                };
                let (ha, hb, hbias) = (bytes_of(1, (2 * m * k).max(1)), bytes_of(2, (k * n).max(1)), bytes_of(3, n));
                let out_bytes = 2 * m * n * dtype.size_bytes();
                let (mut want_saved, mut want) = (vec![0u8; out_bytes], vec![0u8; out_bytes]);
                let (wa, wb, wbias) = (words(&ha), words(&hb), words(&hbias));
                let host_bias = if with_bias { view(&wbias, hbias.len()) } else { &[][..] };
                crate::cpu::gemm::bmm_bytes_saving(
                    &spec,
                    dtype,
                    view(&wa, ha.len()),
                    view(&wb, hb.len()),
                    host_bias,
                    &mut want_saved,
                    &mut want,
                )
                .unwrap();
                let (da, db, dbias) = (uploaded(&dev, &ha), uploaded(&dev, &hb), uploaded(&dev, &hbias));
                let (saved, out) =
                    (DeviceMemory::alloc(&dev, out_bytes).unwrap(), DeviceMemory::alloc(&dev, out_bytes).unwrap());
                let op = |m: &DeviceMemory| DevOperand { ptr: m.ptr(), bytes: m.bytes() };
                let dev_bias = with_bias.then(|| op(&dbias));
                blas::bmm(&dev, &spec, dtype, dtype, op(&da), op(&db), dev_bias, None, Some(op(&saved)), op(&out))
                    .unwrap();
                // SAFETY: the allocations hold `out_bytes` bytes.
                let (got_saved, got) = unsafe {
                    (
                        memory::download(&dev, saved.ptr(), out_bytes).unwrap(),
                        memory::download(&dev, out.ptr(), out_bytes).unwrap(),
                    )
                };
                let f = |b: &[u8]| HostData::from_bytes(dtype, b).unwrap().to_f64_vec();
                let tol = if dtype == DType::F32 { 1e-5 } else { 1e-2 };
                let what = format!("{m}x{n}x{k} bias={with_bias} ({dtype})");
                let kernel = counter(&blas::ACTIVATION_KERNELS) > kernels_before;
                if n % 8 == 0 && k > 0 {
                    assert!(!kernel, "{what}: cuBLASLt did not take CUBLASLT_EPILOGUE_GELU_AUX(_BIAS)");
                }
                assert_close(&f(&got_saved), &f(&want_saved), tol, &format!("saved input {what}"));
                assert_close(&f(&got), &f(&want), tol, &format!("gelu {what}"));
                eprintln!("{what}: {}", if kernel { "product, copy, activation kernel" } else { "in cuBLASLt" });
            }
        }
    }
}

/// `bmm` (extern, cuBLASLt) then a fallback cumsum reading it from a slot, no kernel compiled.
#[test]
fn extern_only_graph_runs_without_compiling() {
    let Some(dev) = gpu() else { return };
    let dir = TempDir::new("extern");
    let (m, n, k) = (4, 3, 5);
    let f = DType::F32;
    let (program, schedule) = crate::test_graphs::extern_only(m, n, k);
    let module = CudaModule { source: String::new(), kernels: vec![], language: Language::CudaC };
    let g = CudaCompiledGraph::new_in(
        dev,
        program.clone(),
        schedule.clone(),
        vec![None, None],
        std::slice::from_ref(&module),
        &dir.0,
    )
    .unwrap();
    assert!(g.cubin_path().is_none() && !g.cache_hit() && g.compile_seconds() == 0.0);
    let a = Buffer::new(vec![2, k, m], HostData::from_f64_slice(f, &randoms(5, 2 * k * m))).unwrap();
    let b = Buffer::new(vec![k, n], HostData::from_f64_slice(f, &randoms(6, k * n))).unwrap();
    let got = g.run_host(&[&a, &b]).unwrap().remove(0);
    // The same graph on the CPU backend is the reference.
    let cpu = crate::cpu::CompiledGraph::new_in(program, schedule, vec![None, None], "", &dir.0).unwrap();
    let want = cpu.run(&[&a, &b]).unwrap().remove(0);
    assert_close(&got.data.to_f64_vec(), &want.data.to_f64_vec(), 1e-5, "bmm + cumsum");
}

#[test]
fn kernels_differing_only_in_their_names_compile_as_one_unit() {
    let unit = |name: &str, body: &str| CudaModule {
        source: format!(
            "// {name}: pointwise\n.visible .entry {name}(\n\t.param .u64 {name}_param_0\n)\n{{\n{body}\n}}\n"
        ),
        kernels: vec![CudaKernel {
            name: name.to_string(),
            launch: Launch { grid: 1, block: 32, shared_bytes: 0, per_block: 32, max_grid: 0, cluster: 1 },
        }],
        language: Language::Ptx { level: 4 },
    };
    let (a, b) = (canonical_unit(&unit("poi_fused_add_3", "ret;")), canonical_unit(&unit("poi_fused_add_30", "ret;")));
    assert_eq!(a.source, b.source);
    assert_eq!(a.kernels[0].name, CANONICAL_KERNEL);
    assert!(!a.source.contains("poi_fused"), "{}", a.source);
    assert_ne!(a.source, canonical_unit(&unit("poi_fused_add_3", "exit;")).source);
}
