//! The packed product against a float64 reference on the same (rounded) operands: tails of
//! every dim, k = 0 and 1, k split into blocks, operands with unit stride along k, along the
//! rows, or neither, broadcast batches, a strided bias and the GELU epilogue, in every dtype and
//! layout this machine serves.

use super::{a_parts, bmm, tile_tasks, Library, Operands, SPLIT_PANELS};
use crate::cpu::gemm::{bmm_bytes_with, BmmSpec, GemmEngine};
use coil_codegen::templates::gemm_cpu::{Blocking, IsaCap, Layout};
use coil_ir::loops::{Activation, BiasOperand, BufferId, StridedOperand};
use coil_ir::{DType, ErrorKind};
use half::{bf16, f16};

/// The build a layout's tests run: the AVX2 kernels from the build capped at AVX2 (the same
/// kernels a CPU without AVX-512 gets from the native one), the others from the native build.
fn cap(layout: Layout) -> IsaCap {
    match layout {
        Layout::F32Avx2 => IsaCap::Avx2,
        Layout::F32 | Layout::Bf16Pairs | Layout::Bf16Amx => IsaCap::Native,
    }
}

/// The library and whether it serves `layout`; on an x86-64 CPU with the layout's instructions
/// (AVX-512 F, BW and VL, and BF16 for the pairs; AVX2, FMA and F16C for the AVX2 layout; for
/// AMX also AMX-TILE and AMX-BF16, with a compiler that targets them and a kernel that grants the
/// tile data) it must, so these tests cannot pass by skipping where they should run.
fn served(layout: Layout) -> Option<&'static Library> {
    #[cfg(target_arch = "x86_64")]
    let cpu = match layout {
        Layout::F32Avx2 => {
            std::is_x86_feature_detected!("avx2")
                && std::is_x86_feature_detected!("fma")
                && std::is_x86_feature_detected!("f16c")
        }
        _ => {
            std::is_x86_feature_detected!("avx512f")
                && std::is_x86_feature_detected!("avx512bw")
                && std::is_x86_feature_detected!("avx512vl")
                && (layout == Layout::F32 || std::is_x86_feature_detected!("avx512bf16"))
        }
    };
    #[cfg(not(target_arch = "x86_64"))]
    let cpu = false;
    // AMX: the compiler's target and the kernel's grant are checked by the template itself
    #[cfg(target_arch = "x86_64")]
    let cpu = cpu && (layout != Layout::Bf16Amx || amx_granted());
    let lib = Library::get(cap(layout));
    let serves = lib.is_some_and(|l| l.serves(layout));
    if cpu && crate::cpu::compiler::c_compiler().is_some() {
        assert!(serves, "this CPU has the instructions for {layout:?} but the packed library does not serve it");
    }
    if !serves {
        eprintln!("skipped: the packed {layout:?} product does not run here");
    }
    serves.then(|| lib.expect("serves"))
}

/// Whether this x86-64 CPU has AMX-TILE and AMX-BF16 (CPUID 7.0 EDX bits 24 and 22), the
/// operating system saves the tile state (XCR0 bits 17 and 18: the kernel then grants the tile
/// data to a process that asks) and the system C compiler targets them (`-march=native`): where
/// all hold, the native build must serve [`Layout::Bf16Amx`].
#[cfg(target_arch = "x86_64")]
fn amx_granted() -> bool {
    #[target_feature(enable = "xsave")]
    unsafe fn xcr0() -> u64 {
        std::arch::x86_64::_xgetbv(0)
    }
    // CPUID leaf 7 exists on every CPU with AVX-512, which the caller checked
    let edx = std::arch::x86_64::__cpuid_count(7, 0).edx;
    let cpu = (edx >> 22) & 1 == 1 && (edx >> 24) & 1 == 1;
    // SAFETY: the CPU has XSAVE (and so XGETBV), checked first.
    let os = std::is_x86_feature_detected!("xsave") && unsafe { xcr0() } >> 17 & 3 == 3;
    let targets = || {
        crate::cpu::compiler::c_compiler().is_some_and(|cc| {
            let command = cc.command();
            let mut words = command.split_whitespace();
            let Some(program) = words.next() else { return false };
            let out = std::process::Command::new(program)
                .args(words)
                .args(["-march=native", "-dM", "-E", "-x", "c", "/dev/null"])
                .output();
            out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("__AMX_BF16__"))
        })
    };
    cpu && os && targets()
}

/// Deterministic values in about [-1, 1) (xorshift).
fn values(seed: u64, len: usize) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f64 / (1u64 << 52) as f64 - 1.0
        })
        .collect()
}

/// `xs` stored in `dtype` (f32, f16, bf16), and the values as stored.
fn stored(dtype: DType, xs: &[f64]) -> (Vec<u8>, Vec<f64>) {
    let mut bytes = Vec::new();
    let mut back = Vec::new();
    for &x in xs {
        match dtype {
            DType::F32 => {
                bytes.extend((x as f32).to_ne_bytes());
                back.push(x as f32 as f64);
            }
            DType::F16 => {
                let h = f16::from_f64(x);
                bytes.extend(h.to_bits().to_ne_bytes());
                back.push(h.to_f64());
            }
            _ => {
                let h = bf16::from_f64(x);
                bytes.extend(h.to_bits().to_ne_bytes());
                back.push(h.to_f64());
            }
        }
    }
    (bytes, back)
}

fn decode(dtype: DType, bytes: &[u8]) -> Vec<f64> {
    match dtype {
        DType::F32 => bytes.chunks(4).map(|c| f32::from_ne_bytes(c.try_into().unwrap()) as f64).collect(),
        DType::F16 => {
            bytes.chunks(2).map(|c| f16::from_bits(u16::from_ne_bytes(c.try_into().unwrap())).to_f64()).collect()
        }
        _ => bytes.chunks(2).map(|c| bf16::from_bits(u16::from_ne_bytes(c.try_into().unwrap())).to_f64()).collect(),
    }
}

/// Bytes copied into u64 words (aligned for any element type), and the view of their length.
struct Aligned(Vec<u64>, usize);

impl Aligned {
    fn new(bytes: &[u8]) -> Aligned {
        let mut words = vec![0u64; bytes.len().div_ceil(8).max(1)];
        bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..bytes.len()].copy_from_slice(bytes);
        Aligned(words, bytes.len())
    }

    fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice::<u64, u8>(&self.0)[..self.1]
    }
}

/// How an operand lies in its buffer.
#[derive(Clone, Copy, Debug)]
enum Lay {
    /// Unit stride along k (A row-major, B a transposed `[n, k]` weight).
    KContiguous,
    /// Unit stride along the rows (A column-major, B row-major `[k, n]`).
    RowsContiguous,
    /// Neither: every element 2 apart, rows padded.
    Strided,
}

/// An operand of `rows x k` per batch (`batches` of them, or one broadcast when `broadcast`):
/// its strided view and the buffer length it needs. `row_stride`/`col_stride` are the view's
/// (A: rows are m; B: the view is `k x n`, so its row stride runs along k).
fn operand(
    lay: Lay,
    rows: usize,
    k: usize,
    batches: usize,
    broadcast: bool,
    is_b: bool,
) -> (StridedOperand<usize>, usize) {
    let (along_rows, along_k, matrix) = match lay {
        Lay::KContiguous => (k, 1, rows * k),
        Lay::RowsContiguous => (1, rows, rows * k),
        Lay::Strided => (2 * k + 3, 2, rows * (2 * k + 3)),
    };
    let offset = 3;
    let batch_stride = if broadcast { 0 } else { matrix + 1 };
    let (row_stride, col_stride) = if is_b { (along_k, along_rows) } else { (along_rows, along_k) };
    let len = offset + batch_stride * (batches - 1) + matrix + 1;
    let op = StridedOperand { buffer: BufferId(0), offset, batch_strides: vec![batch_stride], row_stride, col_stride };
    (op, len)
}

/// Element (r, c) of batch `bt` of a view.
fn at(op: &StridedOperand<usize>, bt: usize, r: usize, c: usize) -> usize {
    op.offset + op.batch_strides[0] * bt + op.row_stride * r + op.col_stride * c
}

struct Case {
    dtype: DType,
    m: usize,
    n: usize,
    k: usize,
    batches: usize,
    lay_a: Lay,
    lay_b: Lay,
    broadcast_a: bool,
    bias: bool,
    gelu: bool,
}

/// Runs `case` with `run` and checks every output element against the f64 reference: within
/// the f32 accumulation's worst case (`k + 2` roundings of the sum of |products|) plus one
/// rounding to the output type.
/// A way to run a product: spec, a, b, bias, out.
type Runner<'a> = &'a dyn Fn(&BmmSpec, &[u8], &[u8], &[u8], &mut [u8]);

fn check(case: &Case, run: Runner) {
    check_into(case, case.dtype, run)
}

/// [`check`] with an output of `out_dtype`: the operands' dtype, or f32 for a widening product.
fn check_into(case: &Case, out_dtype: DType, run: Runner) {
    let Case { dtype, m, n, k, batches, lay_a, lay_b, broadcast_a, bias, gelu } = *case;
    let (sa, la) = operand(lay_a, m, k, batches, broadcast_a, false);
    let (mut sb, lb) = operand(lay_b, n, k, batches, false, true);
    sb.buffer = BufferId(1);
    let bias_view = BiasOperand { buffer: BufferId(2), offset: 1, stride: 3 };
    let spec = BmmSpec {
        a: sa.clone(),
        b: sb.clone(),
        batch: vec![batches],
        m,
        n,
        k,
        bias: bias.then_some(bias_view),
        activation: gelu.then_some(Activation::GeluTanh),
        activation_grad: None,
    };
    let seed = (m * 131 + n * 17 + k) as u64;
    let (a_bytes, a) = stored(dtype, &values(seed, la));
    let (b_bytes, b) = stored(dtype, &values(seed + 1, lb));
    let (bias_bytes, bias_values) = stored(dtype, &values(seed + 2, 3 * n + 2));
    let size = out_dtype.size_bytes();
    let mut out = vec![0u64; (batches * m * n * size).div_ceil(8)];
    let (wa, wb, wbias) = (Aligned::new(&a_bytes), Aligned::new(&b_bytes), Aligned::new(&bias_bytes));
    let out_bytes = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut out)[..batches * m * n * size];
    run(&spec, wa.bytes(), wb.bytes(), if bias { wbias.bytes() } else { &[] }, out_bytes);
    let got = decode(out_dtype, out_bytes);
    // one rounding to the output type: relative, and absolute among f16's subnormals
    let (unit, subnormal) = match out_dtype {
        DType::F32 => (0.0, 0.0),
        DType::F16 => (2f64.powi(-11), 2f64.powi(-25)),
        _ => (2f64.powi(-8), 0.0),
    };
    for bt in 0..batches {
        for i in 0..m {
            for j in 0..n {
                let (mut sum, mut magnitude) = (0.0, 0.0);
                for p in 0..k {
                    let x = a[at(&sa, bt, i, p)] * b[at(&sb, bt, p, j)];
                    sum += x;
                    magnitude += x.abs();
                }
                if bias {
                    sum += bias_values[1 + 3 * j];
                    magnitude += bias_values[1 + 3 * j].abs();
                }
                let mut tol = (k + 2) as f64 * 2f64.powi(-24) * magnitude;
                let want = if gelu {
                    tol = 1.2 * tol + 1e-6 * (1.0 + sum.abs());
                    0.5 * sum * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (sum + 0.044715 * sum.powi(3))).tanh())
                } else {
                    sum
                };
                let g = got[(bt * m + i) * n + j];
                assert!(
                    (g - want).abs() <= tol + unit * want.abs() + subnormal + 1e-30,
                    "{dtype} m{m} n{n} k{k} batch {bt} ({i}, {j}) {lay_a:?}/{lay_b:?}: {g} vs {want} (tol {tol})"
                );
            }
        }
    }
}

fn packed(lib: &'static Library, layout: Layout, dtype: DType) -> impl Fn(&BmmSpec, &[u8], &[u8], &[u8], &mut [u8]) {
    move |spec: &BmmSpec, a: &[u8], b: &[u8], bias: &[u8], out: &mut [u8]| {
        let size = dtype.size_bytes();
        spec.check(a.len() / size, b.len() / size, bias.len() / size, out.len() / size).unwrap();
        bmm(lib, layout, spec, (dtype, dtype), Operands { a, b, bias }, out).unwrap()
    }
}

/// The dtypes each layout serves.
fn dtypes(layout: Layout) -> &'static [DType] {
    match layout {
        Layout::F32 | Layout::F32Avx2 => &[DType::F32, DType::F16, DType::BF16],
        Layout::Bf16Pairs | Layout::Bf16Amx => &[DType::BF16],
    }
}

#[test]
fn packed_products_match_the_reference_at_tails_of_every_dim() {
    for layout in Layout::ALL {
        let Some(lib) = served(layout) else { continue };
        let (mr, nr) = layout.tile();
        for &dtype in dtypes(layout) {
            for m in [1, mr - 1, mr, mr + 1, 3 * mr + 5] {
                for n in [1, 15, nr, nr + 17, 2 * nr + 1] {
                    for k in [0, 1, 2, 3, 16, 33] {
                        let lays = [Lay::KContiguous, Lay::RowsContiguous, Lay::Strided];
                        let (lay_a, lay_b) = (lays[(m + k) % 3], lays[(n + k / 2) % 3]);
                        let case = Case {
                            dtype,
                            m,
                            n,
                            k,
                            batches: 1,
                            lay_a,
                            lay_b,
                            broadcast_a: false,
                            bias: false,
                            gelu: false,
                        };
                        check(&case, &packed(lib, layout, dtype));
                    }
                }
            }
        }
    }
}

/// A last A panel of every row count below MR (the template's edge kernels of 4 and 8 rows
/// read the first rows of a full-width packed panel), in both orientations (m and n alike, so
/// the swapped product has the same edge), through blocks of k (partial sums in the scratch)
/// and with a bias and GELU in the finish.
#[test]
fn packed_products_compute_a_last_panel_of_every_row_count() {
    for layout in Layout::ALL {
        let Some(lib) = served(layout) else { continue };
        let (mr, _) = layout.tile();
        for &dtype in dtypes(layout) {
            for rows in 1..mr {
                let m = 2 * mr + rows;
                for (lay_a, lay_b, bias, gelu, k) in [
                    (Lay::KContiguous, Lay::KContiguous, false, false, 37),
                    (Lay::RowsContiguous, Lay::RowsContiguous, true, true, 70),
                    (Lay::KContiguous, Lay::RowsContiguous, true, false, 4099),
                ] {
                    for n in [m, 40] {
                        let case = Case { dtype, m, n, k, batches: 1, lay_a, lay_b, broadcast_a: false, bias, gelu };
                        check(&case, &packed(lib, layout, dtype));
                    }
                }
            }
        }
    }
}

#[test]
fn packed_products_read_every_layout_of_both_operands() {
    let lays = [Lay::KContiguous, Lay::RowsContiguous, Lay::Strided];
    for layout in Layout::ALL {
        let Some(lib) = served(layout) else { continue };
        for &dtype in dtypes(layout) {
            for lay_a in lays {
                for lay_b in lays {
                    // odd and even k (bf16 pairs read whole words, then the odd one alone)
                    for k in [37, 70] {
                        let case = Case {
                            dtype,
                            m: 29,
                            n: 45,
                            k,
                            batches: 1,
                            lay_a,
                            lay_b,
                            broadcast_a: false,
                            bias: false,
                            gelu: false,
                        };
                        check(&case, &packed(lib, layout, dtype));
                    }
                }
            }
        }
    }
}

#[test]
fn packed_products_split_long_k_into_blocks() {
    for layout in Layout::ALL {
        let Some(lib) = served(layout) else { continue };
        let k = 4099;
        assert!(Blocking::choose(layout, k).k_blocks(layout, k) > 1);
        for &dtype in dtypes(layout) {
            for (lay_a, lay_b, bias, gelu) in
                [(Lay::KContiguous, Lay::KContiguous, true, true), (Lay::RowsContiguous, Lay::Strided, false, false)]
            {
                let case = Case { dtype, m: 14, n: 35, k, batches: 2, lay_a, lay_b, broadcast_a: false, bias, gelu };
                check(&case, &packed(lib, layout, dtype));
            }
        }
    }
}

#[test]
fn packed_products_run_batches_with_a_broadcast_operand_a_bias_and_gelu() {
    for layout in Layout::ALL {
        let Some(lib) = served(layout) else { continue };
        for &dtype in dtypes(layout) {
            // the larger run in parallel tasks over batches, columns and rows (150 x 90 x 700:
            // rows too, with B packed whole first); with m >= 2n the template multiplies b^T a^T
            // and stores transposed tiles
            for (m, n, k, batches) in
                [(5, 7, 9, 3), (100, 300, 70, 4), (300, 40, 50, 1), (90, 20, 33, 3), (150, 90, 700, 1)]
            {
                for (broadcast_a, bias, gelu) in [(true, true, true), (false, true, false), (false, false, true)] {
                    let case = Case {
                        dtype,
                        m,
                        n,
                        k,
                        batches,
                        lay_a: Lay::KContiguous,
                        lay_b: Lay::KContiguous,
                        broadcast_a,
                        bias,
                        gelu,
                    };
                    check(&case, &packed(lib, layout, dtype));
                }
            }
        }
    }
}

/// The engines agree through `bmm_bytes_with` (the crate's path checked the same way), and
/// `Packed` is refused where it cannot run rather than falling back.
#[test]
fn the_engines_agree_and_packed_is_an_error_where_it_cannot_run() {
    let avx2 = served(Layout::F32Avx2).map(|_| GemmEngine::PackedAvx2);
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for engine in [GemmEngine::Crate, GemmEngine::Auto].into_iter().chain(avx2) {
            let run = move |spec: &BmmSpec, a: &[u8], b: &[u8], bias: &[u8], out: &mut [u8]| {
                bmm_bytes_with(engine, spec, dtype, a, b, bias, out).unwrap()
            };
            let case = Case {
                dtype,
                m: 33,
                n: 70,
                k: 65,
                batches: 2,
                lay_a: Lay::Strided,
                lay_b: Lay::KContiguous,
                broadcast_a: true,
                bias: true,
                gelu: true,
            };
            check(&case, &run);
        }
    }
    let (a, _) = operand(Lay::KContiguous, 2, 2, 1, false, false);
    let (b, _) = operand(Lay::KContiguous, 2, 2, 1, false, true);
    let spec = BmmSpec { a, b, batch: vec![1], m: 2, n: 2, k: 2, bias: None, activation: None, activation_grad: None };
    let x = Aligned::new(&[0u8; 64]);
    let mut out = [0u64; 4];
    let f64_result = bmm_bytes_with(
        GemmEngine::Packed,
        &spec,
        DType::F64,
        x.bytes(),
        x.bytes(),
        &[],
        bytemuck::cast_slice_mut(&mut out),
    );
    assert!(f64_result.is_ok(), "f64 ignores the engine");
    for (engine, cap) in [(GemmEngine::Packed, IsaCap::Native), (GemmEngine::PackedAvx2, IsaCap::Avx2)] {
        if Library::get(cap).and_then(|l| l.layout_for(DType::F32)).is_none() {
            let out = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut out)[..16];
            let err = bmm_bytes_with(engine, &spec, DType::F32, x.bytes(), x.bytes(), &[], out).unwrap_err();
            assert_eq!(err.kind, ErrorKind::Unsupported);
        }
    }
}

#[test]
fn tasks_cover_every_tile_once_and_shrink_toward_the_end() {
    for (batches, mp, np, want) in [
        (1, 35, 114, 8),
        (1, 18, 28, 8),
        (1, 75, 8, 8),
        (2, 60, 3, 8),
        (1, 19, 6, 8),
        (3, 2, 2, 8),
        (12, 5, 7, 8),
        (1, 1, 1, 8),
        (2, 4, 3, 1),
    ] {
        let tm = a_parts(batches, mp, np, want);
        for threads in [0, 2, 4] {
            let tasks = tile_tasks(batches, mp, np, tm, threads);
            let mut seen = vec![0u8; batches * mp * np];
            for t in &tasks {
                for i in t.i0..t.i1 {
                    for j in t.j0..t.j1 {
                        seen[(t.batch * mp + i) * np + j] += 1;
                    }
                }
            }
            let case = format!("{batches} x {mp} x {np} on {threads} threads: {tasks:?}");
            assert!(seen.iter().all(|&c| c == 1), "{case}");
            let runs: Vec<usize> = tasks.iter().map(|t| t.j1 - t.j0).collect();
            if threads == 0 {
                assert!(runs.iter().all(|&r| r == np), "one task per line: {case}");
                continue;
            }
            // A's panels are split only when B's are too few; the last tasks are single panels
            assert!(tm == 1 || batches * np < want, "{case}");
            assert_eq!(runs.last(), Some(&1), "{case}");
            // (with the halves of last single panels of long lines)
            let halves = if mp.div_ceil(tm) >= 2 * SPLIT_PANELS { 2 * threads } else { 0 };
            assert!(
                tasks.len() <= 2 * threads * (batches * tm * np).ilog2() as usize + batches * tm + halves,
                "{case}"
            );
        }
    }
    // 150 x 90 x 700 on two threads (the batch test above): A's panels split, so B is packed
    // whole first
    assert_eq!(a_parts(1, 13, 3, 4), 2);
}

/// Half-type operands into an f32 result (`bmm_bytes_to`, a weight gradient read only as f32):
/// the f32 sums unrounded, in both orientations, on the template (where it runs) and the crate.
#[test]
fn widening_products_write_unrounded_f32() {
    use crate::cpu::gemm::bmm_bytes_to_with;
    for (dtype, engine) in
        [DType::F16, DType::BF16].into_iter().flat_map(|d| [(d, GemmEngine::Auto), (d, GemmEngine::Crate)])
    {
        for (m, n, k) in [(29, 45, 37), (90, 20, 64)] {
            let case = Case {
                dtype,
                m,
                n,
                k,
                batches: 2,
                lay_a: Lay::RowsContiguous,
                lay_b: Lay::KContiguous,
                broadcast_a: false,
                bias: true,
                gelu: false,
            };
            let run = |spec: &BmmSpec, a: &[u8], b: &[u8], bias: &[u8], out: &mut [u8]| {
                bmm_bytes_to_with(engine, spec, (dtype, DType::F32), a, b, bias, out).unwrap()
            };
            check_into(&case, DType::F32, &run);
        }
    }
}

/// What a CPU without AVX-512 gets: its native build has only the AVX2 kernels, as the build
/// capped at AVX2 here, and every float type's products go to them (the `Auto` engine then
/// takes the template, not the crate).
#[test]
fn the_avx2_build_multiplies_every_float_type() {
    let Some(lib) = served(Layout::F32Avx2) else { return };
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        assert_eq!(lib.layout_for(dtype), Some(Layout::F32Avx2), "{dtype}");
    }
    assert_eq!(lib.layout_for(DType::F64), None);
}

/// bf16 products over whole steps of 32 k (and, at k = 4162, two blocks of k the last of which
/// ends in a part step). With AMX (its layout) these run the template's tile kernels: two A
/// panels by one B panel at once, an odd panel alone, A read in place or packed as rows (the part
/// panel, an A whose rows are contiguous at each k, a strided one), across several blocks of k,
/// with a bias and GELU, and transposed (`m >= 2n`: the product runs as `b^T a^T`); with the
/// pairs the `vdpbf16ps` kernels over the same.
#[test]
fn packed_bf16_products_over_whole_steps_of_32_k() {
    for layout in [Layout::Bf16Pairs, Layout::Bf16Amx] {
        let Some(lib) = served(layout) else { continue };
        let mr = layout.tile().0;
        assert!(Blocking::choose(layout, 8192).k_blocks(layout, 8192) > 1);
        for (m, n, k, bias, gelu) in [
            (4 * mr + 5, 70, 64, false, false),
            (5 * mr, 33, 96, true, true),
            (3 * mr + 1, 65, 8192, true, true),
            (2 * mr + 3, 40, 4162, true, false),
            (100, 33, 96, true, false),
            (7 * mr, 40, 32, false, true),
        ] {
            for lay_a in [Lay::KContiguous, Lay::RowsContiguous, Lay::Strided] {
                let case = Case {
                    dtype: DType::BF16,
                    m,
                    n,
                    k,
                    batches: 1,
                    lay_a,
                    lay_b: Lay::KContiguous,
                    broadcast_a: false,
                    bias,
                    gelu,
                };
                check(&case, &packed(lib, layout, DType::BF16));
            }
        }
    }
}

/// The f32 training step's products (`mlp_train_step_f32`: 205 x 896 x 224 `nt`, whose B is
/// packed whole panel by panel by the tasks of both parts of A; the weight gradients' `tn`, whose
/// packed A the threads share in chunks) and a batched one with B packed whole, on pools of 1, 2
/// and 3 threads (each with its own tasks and chunks): each against the reference, and the same bits on every pool (tiles split
/// among tasks, never k, so every sum is added in one order).
#[test]
fn products_split_among_threads_give_the_bits_of_one_thread() {
    let Some(lib) = served(Layout::F32) else { return };
    let pools: Vec<rayon::ThreadPool> =
        [1, 2, 3].iter().map(|&t| rayon::ThreadPoolBuilder::new().num_threads(t).build().expect("a pool")).collect();
    let run = |spec: &BmmSpec, a: &[u8], b: &[u8], bias: &[u8], out: &mut [u8]| {
        let mut outs: Vec<Vec<u8>> = Vec::new();
        for pool in &pools {
            let mut o = vec![0u8; out.len()];
            pool.install(|| packed(lib, Layout::F32, DType::F32)(spec, a, b, bias, &mut o));
            outs.push(o);
        }
        for (t, o) in outs.iter().enumerate().skip(1) {
            assert!(
                o == &outs[0],
                "{} threads: other bits than one thread's at {}x{}x{}",
                t + 1,
                spec.m,
                spec.k,
                spec.n
            );
        }
        out.copy_from_slice(&outs[0]);
    };
    for (m, k, n, lay_a, lay_b, batches) in [
        (205, 896, 224, Lay::KContiguous, Lay::KContiguous, 1),
        (224, 205, 896, Lay::RowsContiguous, Lay::RowsContiguous, 1),
        (896, 205, 256, Lay::RowsContiguous, Lay::RowsContiguous, 1),
        (205, 224, 896, Lay::KContiguous, Lay::RowsContiguous, 1),
        (150, 2000, 40, Lay::KContiguous, Lay::RowsContiguous, 2),
    ] {
        let case =
            Case { dtype: DType::F32, m, n, k, batches, lay_a, lay_b, broadcast_a: false, bias: true, gelu: false };
        check(&case, &run);
    }
}
