//! Tests of the CPU backend with hand-written C (the code generator is tested on its own).
//! Every test uses its own cache directory, so tests running in parallel never share entries.

use super::gemm::{bmm, BmmSpec};
use super::*;
use crate::test_graphs::{buffer, fused, pointwise, tile};
use coil_ir::kernel::KernelKind;
use coil_ir::kernel::{FusedKernel, MemoryPlan};
use coil_ir::loops::{LoopNode, StridedOperand};
use coil_ir::sym::Expr;
use coil_ir::{BinaryOp, DType, ErrorKind, Op, TensorMeta};

/// A fresh directory, removed when dropped.
pub(crate) struct TempDir(pub PathBuf);

impl TempDir {
    pub(crate) fn new(name: &str) -> TempDir {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        let dir = std::env::temp_dir().join(format!("coil-test-{name}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The system compiler, or `None` after printing why the test is skipped (it then checks
/// nothing: there is nothing to compile).
pub(super) fn cc() -> Option<&'static CCompiler> {
    crate::testing::c_compiler()
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

fn assert_close(got: &Buffer, want: &Buffer, tol: f64) {
    assert_eq!(got.meta(), want.meta());
    for (i, (g, w)) in got.data.to_f64_vec().iter().zip(want.data.to_f64_vec()).enumerate() {
        assert!((g - w).abs() <= tol * (1.0 + w.abs()), "element {i}: {g} vs {w}");
    }
}

const ADD_C: &str = r#"
#include <stdint.h>
void poi_fused_add_0(char *const *args, int64_t *status) {
    const float *in_ptr0 = (const float *)args[0];
    const float *in_ptr1 = (const float *)args[1];
    float *out_ptr0 = (float *)args[2];
    #pragma omp parallel for
    for (int64_t x = 0; x < 1000; x++) out_ptr0[x] = in_ptr0[x] + in_ptr1[x];
}
"#;

/// `buf2 = arg0 + arg1` over 1000 f32; outputs `(buf2, arg0, buf2)`.
fn add_graph(dir: &Path) -> Result<CompiledGraph> {
    graph_of_c(dir, ADD_C)
}

/// [`add_graph`]'s program and schedule with kernel `poi_fused_add_0` compiled from `c_source`.
fn graph_of_c(dir: &Path, c_source: &str) -> Result<CompiledGraph> {
    let (program, schedule, tiles) = add_parts();
    CompiledGraph::new_in(program, schedule, tiles, c_source, dir)
}

/// [`add_graph`]'s program, schedule and tile kernel.
fn add_parts() -> (LoopProgram, Schedule, Vec<Option<TileKernel>>) {
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
    (program, schedule, vec![Some(k)])
}

/// A graph's kernels load by their library's key, without the source (the graph cache), and a
/// key whose entry is gone, damaged or lacks a kernel is `None` (the caller compiles).
#[test]
fn a_graph_loads_by_its_library_key() {
    let Some(_) = cc() else { return };
    let dir = TempDir::new("by-key");
    let source = format!("{ADD_C}/* loaded by key */\n");
    let key = graph_of_c(&dir.0, &source).unwrap().library_key().unwrap().to_string();
    let (program, schedule, tiles) = add_parts();
    let by_key =
        |key: Option<&str>| CompiledGraph::from_cache_in(program.clone(), schedule.clone(), tiles.clone(), key, &dir.0);
    let g = by_key(Some(&key)).unwrap().expect("the entry is there");
    assert!(g.cache_hit() && g.compile_seconds() == 0.0 && g.library_key() == Some(key.as_str()));
    let (a, b) = (Buffer::from_vec(vec![1.5f32; 1000], vec![1000]), Buffer::from_vec(vec![2.0f32; 1000], vec![1000]));
    assert_eq!(g.run(&[&a, &b]).unwrap()[0].to_vec::<f32>(), vec![3.5f32; 1000]);
    // a kernel the library lacks, a damaged entry, no entry: not loaded
    assert!(module::load_cached(&key, &dir.0, &["poi_fused_add_0", "missing"]).is_none());
    let entry = CompiledObject::cached(&dir.0, &key).path;
    let good = std::fs::read(&entry).unwrap();
    std::fs::write(&entry, flip(&good, good.len() / 2)).unwrap();
    assert!(by_key(Some(&key)).unwrap().is_none());
    std::fs::remove_file(&entry).unwrap();
    assert!(by_key(Some(&key)).unwrap().is_none());
    // a key without kernels, or kernels without a key: inconsistent
    assert!(by_key(None).is_err());
}

#[test]
fn add_kernel_runs_and_second_build_hits_the_cache() {
    let Some(_) = cc() else { return };
    let dir = TempDir::new("add");
    let g = add_graph(&dir.0).unwrap();
    assert!(!g.cache_hit());
    assert!(g.compile_seconds() > 0.0);
    let a: Vec<f32> = randoms(1, 1000).iter().map(|&x| x as f32).collect();
    let b: Vec<f32> = randoms(2, 1000).iter().map(|&x| x as f32).collect();
    let (ba, bb) = (Buffer::from_vec(a.clone(), vec![1000]), Buffer::from_vec(b.clone(), vec![1000]));
    let out = g.run(&[&ba, &bb]).unwrap();
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    assert_eq!(out[0].to_vec::<f32>(), want);
    assert_eq!(out[1], ba, "an input returned as an output is copied");
    assert_eq!(out[2], out[0], "a repeated output is cloned");

    let again = add_graph(&dir.0).unwrap();
    assert!(again.cache_hit());
    assert_eq!(again.compile_seconds(), 0.0);
    assert_eq!(again.library_path(), g.library_path());
    let src = std::fs::read_to_string(again.source_path().unwrap()).unwrap();
    assert_eq!(src, ADD_C, "the source is kept beside the shared object");
    assert_eq!(again.run(&[&ba, &bb]).unwrap()[0].to_vec::<f32>(), want);

    // Wrong inputs are errors, not crashes.
    let e = g.run(&[&ba]).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Value);
    let short = Buffer::from_vec(vec![0f32; 3], vec![3]);
    assert_eq!(g.run(&[&ba, &short]).unwrap_err().kind, ErrorKind::Shape);
    let ints = Buffer::from_vec(vec![0i32; 1000], vec![1000]);
    assert_eq!(g.run(&[&ba, &ints]).unwrap_err().kind, ErrorKind::DType);
}

#[test]
fn cache_layout_and_key() {
    let Some(cc) = cc() else { return };
    let dir = TempDir::new("layout");
    let (library, obj) = cc.compile("int f(void) { return 1; }\n", &dir.0).unwrap();
    assert!(library.starts_with(b"\x7fELF"), "the payload is the shared object itself");
    assert_eq!(obj.key.len(), 32);
    assert_eq!(obj.path, dir.0.join("c").join(format!("{}.so.entry", obj.key)));
    assert_eq!(obj.source_path, dir.0.join("c").join(format!("{}.c", obj.key)));
    assert_eq!(cc.cache_key("int f(void) { return 1; }\n"), obj.key, "the key is stable");
    assert_ne!(cc.cache_key("int f(void) { return 2; }\n"), obj.key);
    // The entry: a header line naming the kind and the key, then the library.
    let entry = std::fs::read(&obj.path).unwrap();
    let header_len = entry.iter().position(|&b| b == b'\n').unwrap() + 1;
    let header = std::str::from_utf8(&entry[..header_len]).unwrap();
    assert!(header.starts_with(&format!("coil-cache-entry 1 so {} {} ", obj.key, library.len())), "{header}");
    assert_eq!(&entry[header_len..], &library[..]);
    // Nothing but the two entries is left behind (no temporary files, no private copies).
    module::load_or_build(cc, "int f(void) { return 1; }\n", &dir.0, &["f"]).unwrap();
    let mut names: Vec<String> =
        std::fs::read_dir(dir.0.join("c")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, vec![format!("{}.c", obj.key), format!("{}.so.entry", obj.key)]);
}

/// Every kind of damage to a cached library: detected before loading, logged (the reason is
/// kept: [`CompiledGraph::cache_rebuilt_because`]), rebuilt once, and the graph computes the
/// right thing; the rebuilt entry then serves the next build. Each case has a source (and so a
/// key) of its own, its entry made without loading it, so that what the graph runs is what was
/// loaded from that entry (a process opens each key's library once).
#[test]
fn damaged_or_swapped_cache_entries_are_rebuilt_never_loaded() {
    let Some(cc) = cc() else { return };
    let dir = TempDir::new("corrupt");
    let add_c = |case: usize| format!("{ADD_C}/* case {case} */\n");
    // the same kernel name computing a product: another graph's library that would load
    let mul_c = ADD_C.replace(" + ", " * ");
    let (library, mul) = cc.compile(&mul_c, &dir.0).unwrap();
    let good_mul = std::fs::read(&mul.path).unwrap();
    let header_len = |e: &[u8]| e.iter().position(|&b| b == b'\n').unwrap() + 1;
    let hm = header_len(&good_mul);
    assert_eq!(&good_mul[hm..], &library[..]);

    let a: Vec<f32> = randoms(1, 1000).iter().map(|&x| x as f32).collect();
    let b: Vec<f32> = randoms(2, 1000).iter().map(|&x| x as f32).collect();
    let (ba, bb) = (Buffer::from_vec(a.clone(), vec![1000]), Buffer::from_vec(b.clone(), vec![1000]));
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();

    type Damage = fn(&[u8], usize, &[u8], usize) -> Vec<u8>;
    let cases: [(&str, Damage, &str); 11] = [
        ("a flipped byte in the ELF header", |e, h, _, _| flip(e, h + 20), "checksum mismatch"),
        ("a flipped byte in the middle", |e, h, _, _| flip(e, h + (e.len() - h) / 2), "checksum mismatch"),
        ("a flipped last byte", |e, _, _, _| flip(e, e.len() - 1), "checksum mismatch"),
        ("truncated to half", |e, _, _, _| e[..e.len() / 2].to_vec(), "payload bytes"),
        ("truncated to its header", |e, h, _, _| e[..h].to_vec(), "the file has 0"),
        ("empty", |_, _, _, _| Vec::new(), "empty"),
        ("garbage", |_, _, _, _| b"not a shared object at all".to_vec(), "no entry header"),
        ("a bare shared object", |e, h, _, _| e[h..].to_vec(), "no entry header"),
        ("another graph's entry", |_, _, m, _| m.to_vec(), "built for key"),
        ("another graph's header (swapped manifests)", |e, h, m, hm| [&m[..hm], &e[h..]].concat(), "built for key"),
        ("another graph's library under this header", |e, h, m, hm| [&e[..h], &m[hm..]].concat(), "checksum"),
    ];
    for (case, (what, damage, why)) in cases.into_iter().enumerate() {
        let source = add_c(case);
        let (_, entry) = cc.compile(&source, &dir.0).unwrap();
        let good = std::fs::read(&entry.path).unwrap();
        std::fs::write(&entry.path, damage(&good, header_len(&good), &good_mul, hm)).unwrap();
        let g = graph_of_c(&dir.0, &source).unwrap();
        assert!(!g.cache_hit() && g.compile_seconds() > 0.0, "{what}: rebuilt");
        let logged = g.cache_rebuilt_because().unwrap_or_else(|| panic!("{what}: no reason kept"));
        assert!(logged.contains(why), "{what}: {logged}");
        assert_eq!(g.run(&[&ba, &bb]).unwrap()[0].to_vec::<f32>(), want, "{what}");
        let again = graph_of_c(&dir.0, &source).unwrap();
        assert!(again.cache_hit() && again.cache_rebuilt_because().is_none(), "{what}: the rebuilt entry serves");
    }
}

/// `entry` with byte `at` changed.
fn flip(entry: &[u8], at: usize) -> Vec<u8> {
    let mut e = entry.to_vec();
    e[at] ^= 0x5a;
    e
}

#[test]
fn concurrent_compiles_of_one_source_agree() {
    let Some(cc) = cc() else { return };
    let dir = TempDir::new("concurrent");
    let src = "#include <stdint.h>\nvoid k(char *const *a, int64_t *s) { s[1] = 7; }\n";
    let objects: Vec<CompiledObject> = std::thread::scope(|s| {
        let handles: Vec<_> =
            (0..4).map(|_| s.spawn(|| module::load_or_build(cc, src, &dir.0, &["k"]).unwrap().1)).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(objects.iter().all(|o| o.path == objects[0].path && o.rebuilt_because.is_none()));
    // whoever renamed last, the entry is whole and serves the next process
    let (library, again) = cc.compile(src, &dir.0).unwrap();
    assert!(again.cache_hit && library.starts_with(b"\x7fELF"));
}

/// Two processes building one key at once (this test binary, run again with
/// `COIL_TEST_CACHE_CHILD` naming the cache): both compile, both run the kernel, and the entry
/// left serves a third.
#[test]
fn two_processes_building_one_key_both_succeed() {
    let Some(cc) = cc() else { return };
    const SRC: &str = "#include <stdint.h>\nvoid k(char *const *a, int64_t *s) { s[0] = 0; s[3] = 11; }\n";
    let run = |dir: &Path| {
        let (lib, _) = module::load_or_build(cc, SRC, dir, &["k"]).unwrap();
        let mut status = [0i64; 4];
        unsafe { lib.kernel("k").unwrap().call(&[], &mut status) };
        assert_eq!(status[3], 11);
    };
    if let Some(dir) = std::env::var_os("COIL_TEST_CACHE_CHILD") {
        return run(Path::new(&dir));
    }
    let dir = TempDir::new("two-processes");
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..2)
        .map(|_| {
            std::process::Command::new(&exe)
                .args(["--exact", "cpu::tests::two_processes_building_one_key_both_succeed", "--nocapture"])
                .env("COIL_TEST_CACHE_CHILD", &dir.0)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && text.contains("1 passed"), "{text}");
        assert!(!text.contains("rejected"), "no process saw a partial entry: {text}");
    }
    let (_, obj) = cc.compile(SRC, &dir.0).unwrap();
    assert!(obj.cache_hit);
    run(&dir.0);
}

#[test]
fn compile_errors_carry_stderr_and_keep_the_source() {
    let Some(cc) = cc() else { return };
    let dir = TempDir::new("error");
    let src = "void broken(char *const *args, int64_t *status) { this is not C; }\n";
    let e = cc.compile(src, &dir.0).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Runtime);
    let kept = dir.0.join("c").join(format!("{}.c", cc.cache_key(src)));
    assert!(e.message.contains(&kept.display().to_string()), "{e}");
    assert!(e.message.contains("error"), "stderr is in the message: {e}");
    assert_eq!(std::fs::read_to_string(&kept).unwrap(), src);
    assert!(!dir.0.join("c").join(format!("{}.so", cc.cache_key(src))).exists());
}

/// `buf2 = arg0[arg1]`: a gather whose C reports an index out of range through `status`.
#[test]
fn out_of_bounds_index_is_an_error_naming_the_kernel() {
    let Some(_) = cc() else { return };
    let dir = TempDir::new("oob");
    let c = r#"
#include <stdint.h>
void poi_fused_index_select_0(char *const *args, int64_t *status) {
    const float *in_ptr0 = (const float *)args[0];
    const int64_t *in_ptr1 = (const int64_t *)args[1];
    float *out_ptr0 = (float *)args[2];
    for (int64_t x = 0; x < 3; x++) {
        int64_t i = in_ptr1[x];
        if (i < 0 || i >= 5) { status[0] = 1; status[1] = i; status[2] = 5; return; }
        out_ptr0[x] = in_ptr0[i];
    }
}
"#;
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
    let g = CompiledGraph::new_in(program, schedule, vec![Some(tile(name, 3, &args))], c, &dir.0).unwrap();
    let table = Buffer::from_vec(vec![10f32, 11., 12., 13., 14.], vec![5]);
    let ok = g.run(&[&table, &Buffer::from_vec(vec![4i64, 0, 2], vec![3])]).unwrap();
    assert_eq!(ok[0].to_vec::<f32>(), vec![14., 10., 12.]);
    let e = g.run(&[&table, &Buffer::from_vec(vec![1i64, 7, 2], vec![3])]).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Value);
    assert_eq!(e.op.as_deref(), Some(name));
    assert_eq!(e.message, "index 7 is out of bounds for dim of size 5");
}

/// Two kernels through a memory-plan slot, then a fallback cumsum reading that temporary:
/// `buf1 = arg0 * 2` (temp), `buf2 = buf1 + arg0`, `buf3 = cumsum(buf1, dim=1)`.
#[test]
fn temporaries_live_in_slots_and_fallback_ops_read_them() {
    let Some(_) = cc() else { return };
    let dir = TempDir::new("slots");
    let c = r#"
#include <stdint.h>
void poi_fused_mul_0(char *const *args, int64_t *status) {
    const double *in_ptr0 = (const double *)args[0]; double *out_ptr0 = (double *)args[1];
    for (int64_t x = 0; x < 12; x++) out_ptr0[x] = in_ptr0[x] * 2.0;
}
void poi_fused_add_1(char *const *args, int64_t *status) {
    const double *in_ptr0 = (const double *)args[0]; const double *in_ptr1 = (const double *)args[1];
    double *out_ptr0 = (double *)args[2];
    for (int64_t x = 0; x < 12; x++) out_ptr0[x] = in_ptr0[x] + in_ptr1[x];
}
"#;
    let d = DType::F64;
    let cumsum = LoopNode {
        output: BufferId(3),
        origins: vec!["cumsum"],
        kind: LoopKind::Extern { call: ExternCall::Fallback { op: Op::Cumsum { dim: 1 } }, inputs: vec![BufferId(1)] },
    };
    let program = LoopProgram {
        symbols: vec![],
        data_checks: vec![],
        buffers: vec![
            buffer("arg0", &[3, 4], d),
            buffer("buf1", &[3, 4], d),
            buffer("buf2", &[3, 4], d),
            buffer("buf3", &[3, 4], d),
        ],
        inputs: vec![BufferId(0)],
        outputs: vec![BufferId(2), BufferId(3)],
        nodes: vec![pointwise(1, 12, &[0], BinaryOp::Mul, d), pointwise(2, 12, &[1, 0], BinaryOp::Add, d), cumsum],
    };
    let schedule = Schedule {
        kernels: vec![
            fused("poi_fused_mul_0", KernelKind::Pointwise, 0, 12, &[1]),
            fused("poi_fused_add_1", KernelKind::Pointwise, 1, 12, &[2]),
            fused("ext_cumsum_2", KernelKind::Extern, 2, 12, &[3]),
        ],
        refusals: vec![],
        memory: MemoryPlan {
            slots: vec![96],
            slot_of: vec![None, Some(0), None, None],
            peak_bytes: 3 * 96,
            ..Default::default()
        },
    };
    let kernels = vec![
        Some(tile("poi_fused_mul_0", 12, &[("in_ptr0", 0, d, false), ("out_ptr0", 1, d, true)])),
        Some(tile(
            "poi_fused_add_1",
            12,
            &[("in_ptr0", 1, d, false), ("in_ptr1", 0, d, false), ("out_ptr0", 2, d, true)],
        )),
        None,
    ];
    let g = CompiledGraph::new_in(program, schedule, kernels, c, &dir.0).unwrap();
    let x: Vec<f64> = (0..12).map(|i| i as f64).collect();
    let out = g.run(&[&Buffer::from_vec(x.clone(), vec![3, 4])]).unwrap();
    assert_eq!(out[0].to_vec::<f64>(), x.iter().map(|v| 3.0 * v).collect::<Vec<_>>());
    let want: Vec<f64> =
        (0..3).flat_map(|r| (1..=4).map(move |c| (0..c).map(|j| 2.0 * (4 * r + j) as f64).sum())).collect();
    assert_eq!(out[1].to_vec::<f64>(), want);
}

/// The reference: `a_view @ b_view` in the interpreter, where `a` is stored `[2, k, m]` and used
/// transposed, and `b` is stored `[k, n]` and broadcast over the batch.
fn reference_bmm(a: &Buffer, b: &Buffer, (m, n, k): (usize, usize, usize)) -> Buffer {
    let mut g = Graph::new();
    let x = g.input(a.meta());
    let y = g.input(b.meta());
    let xt = g.push(Op::Permute { perm: vec![0, 2, 1] }, &[x], None).unwrap();
    let y3 = g.push(Op::Reshape { shape: vec![1, k, n] }, &[y], None).unwrap();
    let yb = g.push(Op::Expand { shape: vec![2, k, n] }, &[y3], None).unwrap();
    let z = g.push(Op::Bmm, &[xt, yb], None).unwrap();
    g.outputs.push(z);
    let out = interpret(&g, &[a, b]).unwrap().remove(0);
    assert_eq!(out.shape, vec![2, m, n]);
    out
}

/// The same product as [`reference_bmm`], as strided operands: `a` transposed by a stride swap,
/// `b` with batch stride 0.
fn strided_spec(m: usize, n: usize, k: usize) -> (StridedOperand<usize>, StridedOperand<usize>) {
    let a = StridedOperand { buffer: BufferId(0), offset: 0, batch_strides: vec![k * m], row_stride: 1, col_stride: m };
    let b = StridedOperand { buffer: BufferId(1), offset: 0, batch_strides: vec![0], row_stride: n, col_stride: 1 };
    (a, b)
}

#[test]
fn gemm_matches_the_interpreter_with_strides_and_broadcast_batch() {
    // Big enough to take gemm's blocked (and, for the largest, parallel) paths.
    for (m, n, k) in [(3, 5, 4), (33, 17, 65), (70, 80, 90)] {
        let (sa, sb) = strided_spec(m, n, k);
        let spec =
            BmmSpec { a: sa, b: sb, batch: vec![2], m, n, k, bias: None, activation: None, activation_grad: None };
        for (dtype, tol) in
            [(DType::F32, 1e-5), (DType::F64, 1e-12), (DType::BF16, 1e-2), (DType::F16, 2e-3), (DType::I32, 0.0)]
        {
            let scale = if dtype == DType::I32 { 50.0 } else { 1.0 };
            let a = Buffer::new(
                vec![2, k, m],
                HostData::from_f64_slice(dtype, &randoms(3, 2 * k * m).iter().map(|x| x * scale).collect::<Vec<_>>()),
            )
            .unwrap();
            let b = Buffer::new(
                vec![k, n],
                HostData::from_f64_slice(dtype, &randoms(4, k * n).iter().map(|x| x * scale).collect::<Vec<_>>()),
            )
            .unwrap();
            let got = bmm(&spec, &a, &b).unwrap();
            let want = reference_bmm(&a, &b, (m, n, k));
            // Half types: both round one f32 / f64 sum, which may differ in the last bit.
            let tol = tol * (k as f64).sqrt().max(1.0);
            assert_close(&got, &want, tol);
        }
    }
}

#[test]
fn gemm_rejects_views_outside_the_buffer() {
    let (mut sa, sb) = strided_spec(3, 5, 4);
    sa.offset = 1;
    let spec =
        BmmSpec { a: sa, b: sb, batch: vec![2], m: 3, n: 5, k: 4, bias: None, activation: None, activation_grad: None };
    let a = Buffer::from_vec(vec![0f32; 24], vec![2, 4, 3]);
    let b = Buffer::from_vec(vec![0f32; 20], vec![4, 5]);
    assert_eq!(bmm(&spec, &a, &b).unwrap_err().kind, ErrorKind::Runtime);
}

/// An all-extern graph needs no C compiler: bmm through gemm, then a fallback cumsum.
#[test]
fn extern_only_graph_runs_without_compiling() {
    let dir = TempDir::new("extern");
    let (m, n, k) = (4, 3, 5);
    let f = DType::F32;
    let (program, schedule) = crate::test_graphs::extern_only(m, n, k);
    let g = CompiledGraph::new_in(program, schedule, vec![None, None], "", &dir.0).unwrap();
    assert!(g.library_path().is_none() && !g.cache_hit() && g.compile_seconds() == 0.0);
    let a = Buffer::new(vec![2, k, m], HostData::from_f64_slice(f, &randoms(5, 2 * k * m))).unwrap();
    let b = Buffer::new(vec![k, n], HostData::from_f64_slice(f, &randoms(6, k * n))).unwrap();
    let got = g.run(&[&a, &b]).unwrap().remove(0);
    let product = reference_bmm(&a, &b, (m, n, k));
    let mut cg = Graph::new();
    let x = cg.input(product.meta());
    let y = cg.push(Op::Cumsum { dim: 2 }, &[x], None).unwrap();
    cg.outputs.push(y);
    assert_close(&got, &interpret(&cg, &[&product]).unwrap()[0], 1e-5);
}

#[test]
fn inconsistent_pieces_are_rejected() {
    let dir = TempDir::new("inconsistent");
    let program = LoopProgram {
        symbols: vec![],
        data_checks: vec![],
        buffers: vec![buffer("arg0", &[4], DType::F32)],
        inputs: vec![BufferId(0)],
        outputs: vec![BufferId(0)],
        nodes: vec![],
    };
    let schedule = Schedule { kernels: vec![fused("poi_0", KernelKind::Pointwise, 0, 4, &[])], ..Default::default() };
    let e = CompiledGraph::new_in(program.clone(), schedule.clone(), vec![], "", &dir.0).unwrap_err();
    assert!(e.message.contains("1 scheduled kernels"), "{e}");
    let e = CompiledGraph::new_in(program.clone(), schedule, vec![None], "", &dir.0).unwrap_err();
    assert!(e.message.contains("has no tile kernel"), "{e}");
    // An identity graph (output = input) has no kernels at all.
    let g = CompiledGraph::new_in(program, Schedule::default(), vec![], "", &dir.0).unwrap();
    let x = Buffer::from_vec(vec![1f32, 2., 3., 4.], vec![4]);
    assert_eq!(g.run(&[&x]).unwrap(), vec![x]);
}

#[test]
fn compiled_graphs_can_be_shared_across_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<CompiledGraph>();
}

#[test]
fn a_missing_compiler_is_none() {
    assert!(CCompiler::from_command("coil-no-such-compiler-exists").is_none());
    assert!(CCompiler::from_command("   ").is_none());
}

/// A compiler without `-fopenmp-simd`: the build is retried without it, and later builds
/// skip it.
#[cfg(unix)]
#[test]
fn builds_without_simd_pragmas_when_the_flag_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let Some(cc) = cc() else { return };
    let dir = TempDir::new("no-openmp-simd");
    let script = dir.0.join("cc-without-openmp-simd");
    let body = format!(
        "#!/bin/sh\nfor a in \"$@\"; do [ \"$a\" = -fopenmp-simd ] && {{ echo 'unrecognized option -fopenmp-simd' >&2; exit 1; }}; done\nexec {} \"$@\"\n",
        cc.command()
    );
    std::fs::write(&script, body).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let fake = CCompiler::from_command(script.to_str().unwrap()).unwrap();
    assert_eq!(fake.version(), cc.version());
    assert!(fake.simd_pragmas());
    let src = "#include <stdint.h>\nvoid k(char *const *a, int64_t *s) { s[2] = 5; }\n";
    let (lib, obj) = module::load_or_build(&fake, src, &dir.0.join("cache"), &["k"]).unwrap();
    assert!(!obj.cache_hit && !fake.simd_pragmas());
    let mut status = [0i64; 4];
    unsafe { lib.kernel("k").unwrap().call(&[], &mut status) };
    assert_eq!(status[2], 5);
    let e = fake.compile("not C", &dir.0.join("cache")).unwrap_err();
    assert!(!e.message.contains("unrecognized option"), "no retry noise once the flag is known refused: {e}");
}

/// One kernel per loop node (the real scheduler fuses; this keeps the end-to-end test
/// independent of its choices).
fn per_node_schedule(p: &LoopProgram) -> Schedule {
    let numel = |r: &[Expr]| r.iter().map(|e| e.const_value().unwrap()).product::<i64>();
    let kernels = p
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let (kind, x, r) = match &n.kind {
                LoopKind::Pointwise { ranges, .. } => (KernelKind::Pointwise, numel(ranges), None),
                LoopKind::Reduction { ranges, reduction_ranges, .. } => {
                    let r = numel(reduction_ranges);
                    let kind = if r <= 1024 { KernelKind::PersistentReduction } else { KernelKind::LoopedReduction };
                    (kind, numel(ranges), Some(r))
                }
                LoopKind::Extern { .. } => (KernelKind::Extern, p.buffer(n.output).meta.numel() as i64, None),
            };
            let name = format!("{}_fused_{}_{i}", kind.prefix(), n.origins.join("_"));
            let (xnumel, rnumel) = (Expr::int(x), r.map(Expr::int));
            FusedKernel { name, kind, nodes: vec![i], xnumel, rnumel, stores: vec![n.output] }
        })
        .collect();
    Schedule { kernels, ..Default::default() }
}

/// Graph -> decompose -> lower -> (per-node schedule) -> build_kernel -> emit_c -> run,
/// against the interpreter: a softmax-like reduction, a matmul (gemm), a cumsum (fallback), an
/// input returned as an output, and an index_select whose bad index the C code reports.
#[test]
fn end_to_end_with_the_code_generator() {
    let Some(_) = cc() else { return };
    let dir = TempDir::new("e2e");
    let mut g = Graph::new();
    let x = g.input(TensorMeta::new(vec![8, 33], DType::F32));
    let y = g.input(TensorMeta::new(vec![33, 5], DType::F32));
    let idx = g.input(TensorMeta::new(vec![3], DType::I64));
    let e = g.push(Op::Unary(coil_ir::UnaryOp::Exp), &[x], None).unwrap();
    let sum = coil_ir::ReduceOp::Sum;
    let s = g.push(Op::Reduce { op: sum, dims: vec![1], keepdim: true }, &[e], None).unwrap();
    let d = g.push(Op::Binary(BinaryOp::Div), &[e, s], None).unwrap();
    let m = g.push(Op::Matmul, &[d, y], None).unwrap();
    let c = g.push(Op::Cumsum { dim: 0 }, &[m], None).unwrap();
    let rows = g.push(Op::IndexSelect { dim: 0 }, &[x, idx], None).unwrap();
    g.outputs.extend([c, d, x, rows]);
    let prim = coil_passes::decompose(&g).unwrap();
    let program = coil_passes::lower(&prim).unwrap();
    let schedule = per_node_schedule(&program);
    let tiles: Vec<Option<TileKernel>> = schedule
        .kernels
        .iter()
        .map(|k| (k.kind != KernelKind::Extern).then(|| coil_codegen::build_kernel(&program, k)))
        .collect();
    let source = coil_codegen::emit_c(&tiles.iter().flatten().cloned().collect::<Vec<_>>());
    let cg = CompiledGraph::new_in(program, schedule, tiles, &source, &dir.0).unwrap();

    let xb = Buffer::new(vec![8, 33], HostData::from_f64_slice(DType::F32, &randoms(7, 264))).unwrap();
    let yb = Buffer::new(vec![33, 5], HostData::from_f64_slice(DType::F32, &randoms(8, 165))).unwrap();
    let good = Buffer::from_vec(vec![7i64, 0, 3], vec![3]);
    let got = cg.run(&[&xb, &yb, &good]).unwrap();
    let want = interpret(&prim, &[&xb, &yb, &good]).unwrap();
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        assert_close(g, w, 1e-5);
    }
    let bad = Buffer::from_vec(vec![1i64, 8, 2], vec![3]);
    let e = cg.run(&[&xb, &yb, &bad]).unwrap_err();
    // Word for word the interpreter's message (the kernel's check knows the dim it indexes).
    let reference = interpret(&prim, &[&xb, &yb, &bad]).unwrap_err();
    assert_eq!(e.message, reference.message, "{e}");
    assert!(e.message.starts_with("index 8 is out of bounds for dim "), "{e}");
    assert!(e.op.as_deref().unwrap().contains("index_select"), "{e}");
}

/// `gelu(linear(x, w, b?), tanh)` lowers to one `Bmm` call with the activation (no kernel to
/// compile), and the CPU's fused product (bias, then gelu_tanh in f32, one rounding) matches
/// the interpreter on the unfused primitive graph (the product and the bias add rounded to the
/// dtype, then the gelu's own nodes).
#[test]
fn fused_gelu_tanh_product_matches_the_unfused_graph() {
    let dir = TempDir::new("gelu-epilogue");
    for (dtype, tol) in [(DType::F32, 1e-5), (DType::BF16, 1e-2), (DType::F16, 2e-3)] {
        for bias in [true, false] {
            let (k, n) = (65, 40);
            let mut g = Graph::new();
            let x = g.input(TensorMeta::new(vec![2, 7, k], dtype));
            let w = g.input(TensorMeta::new(vec![n, k], dtype));
            let mut args = vec![x, w];
            if bias {
                args.push(g.input(TensorMeta::new(vec![n], dtype)));
            }
            let y = g.push(Op::Linear { bias }, &args, None).unwrap();
            let z = g.push(Op::Gelu { tanh: true }, &[y], None).unwrap();
            g.outputs.push(z);
            let prim = coil_passes::decompose(&g).unwrap();
            let (simple, _) = coil_passes::simplify(&prim, &Default::default()).unwrap();
            let program = coil_passes::lower(&simple).unwrap();
            assert_eq!(program.nodes.len(), 1, "{program}");
            let LoopKind::Extern { call: ExternCall::Bmm { activation, .. }, .. } = &program.nodes[0].kind else {
                panic!("{program}")
            };
            assert_eq!(*activation, Some(coil_ir::loops::Activation::GeluTanh), "{program}");
            let schedule = per_node_schedule(&program);
            let cg = CompiledGraph::new_in(program, schedule, vec![None], "", &dir.0).unwrap();

            // Inputs scaled so the gelu sees values on both sides of its bend (|x @ w^T| ~ 3).
            let data = |seed: u64, shape: &[usize], scale: f64| {
                let len = shape.iter().product();
                let xs: Vec<f64> = randoms(seed, len).iter().map(|v| v * scale).collect();
                Buffer::new(shape.to_vec(), HostData::from_f64_slice(dtype, &xs)).unwrap()
            };
            let inputs = [data(1, &[2, 7, k], 1.0), data(2, &[n, k], 0.6), data(3, &[n], 1.0)];
            let inputs: Vec<&Buffer> = inputs.iter().take(args.len()).collect();
            let got = cg.run(&inputs).unwrap().remove(0);
            let want = interpret(&prim, &inputs).unwrap().remove(0);
            assert_close(&got, &want, tol);
            // Negative inputs really were bent (not a linear map that happens to agree).
            assert!(want.data.to_f64_vec().iter().any(|&v| v < -0.05), "{dtype}");
        }
    }
}

/// The activation at the spec level: `bmm_bytes` with `GeluTanh` is `bmm_bytes` without it, then
/// gelu_tanh on each f32 element (k = 0 included: the gelu of the bias), and f64 computes in f64.
/// f32 uses the C prelude's tanh (within 2.5 ulp of Rust's), f64 Rust's (exactly).
#[test]
fn gemm_applies_the_activation_after_the_bias() {
    use coil_ir::loops::{Activation, BiasOperand};
    // the second size runs the bias rows and the activation in parallel chunks
    for (m, n, k) in [(5, 6, 7), (5, 6, 0), (130, 70, 9)] {
        for dtype in [DType::F32, DType::F64] {
            let (sa, sb) = strided_spec(m, n, k);
            let bias = Some(BiasOperand { buffer: BufferId(2), offset: 1, stride: 2 });
            let plain =
                BmmSpec { a: sa, b: sb, batch: vec![2], m, n, k, bias, activation: None, activation_grad: None };
            let fused = BmmSpec { activation: Some(Activation::GeluTanh), ..plain.clone() };
            let bytes = |seed: u64, len: usize| HostData::from_f64_slice(dtype, &randoms(seed, len.max(1))).to_bytes();
            let (a, b, bias) = (bytes(1, 2 * k * m), bytes(2, k * n), bytes(3, 2 * n + 1));
            let out_len = 2 * m * n * dtype.size_bytes();
            // Operands and outputs in u64 words, so aligned for the element casts.
            let (wa, wb, wbias) = (aligned(&a), aligned(&b), aligned(&bias));
            let bytes_of = |w: &[u64], len: usize| bytemuck::cast_slice::<u64, u8>(w)[..len].to_vec();
            let run = |spec: &BmmSpec| {
                let mut words = vec![0u64; out_len / 8];
                let (a, b) = (&bytemuck::cast_slice::<u64, u8>(&wa)[..a.len()], &bytemuck::cast_slice(&wb)[..b.len()]);
                let bias = &bytemuck::cast_slice::<u64, u8>(&wbias)[..bias.len()];
                super::gemm::bmm_bytes(spec, dtype, a, b, bias, bytemuck::cast_slice_mut(&mut words)).unwrap();
                bytes_of(&words, out_len)
            };
            let (want, got) = (run(&plain), run(&fused));
            let got = HostData::from_bytes(dtype, &got).unwrap().to_f64_vec();
            for (i, (g, w)) in got.iter().zip(HostData::from_bytes(dtype, &want).unwrap().to_f64_vec()).enumerate() {
                let (expect, tol) = match dtype {
                    DType::F32 => (Activation::GeluTanh.apply_f32(w as f32) as f64, 1e-6),
                    _ => (Activation::GeluTanh.apply_f64(w), 0.0),
                };
                assert!((g - expect).abs() <= tol * (1.0 + expect.abs()), "{dtype} k={k} element {i}: {g} vs {expect}");
            }
        }
    }
    // Integers have no activation.
    let (m, n, k) = (5, 6, 7);
    let (sa, sb) = strided_spec(m, n, k);
    let spec = BmmSpec {
        a: sa,
        b: sb,
        batch: vec![2],
        m,
        n,
        k,
        bias: None,
        activation: Some(Activation::GeluTanh),
        activation_grad: None,
    };
    let a = Buffer::from_vec(vec![1i32; 2 * k * m], vec![2, k, m]);
    let b = Buffer::from_vec(vec![1i32; k * n], vec![k, n]);
    assert_eq!(bmm(&spec, &a, &b).unwrap_err().kind, ErrorKind::Unsupported);
}

/// An activation's gradient as the product's epilogue (`bmm_bytes_grad`): the plain product
/// times `act'(aux)`, for strided operands, in f32, f64 and bf16 (whose product is not rounded
/// before the derivative multiplies it: compared at bf16's precision), and `k = 0` gives zeros;
/// a saved input of the wrong size is an error, and the plain entry point refuses such a spec.
#[test]
fn gemm_multiplies_the_product_by_the_activation_gradient() {
    use coil_ir::loops::Activation;
    for (m, n, k) in [(5, 6, 7), (5, 6, 0), (130, 70, 9)] {
        for (dtype, tol) in [(DType::F32, 1e-6), (DType::F64, 1e-14), (DType::BF16, 1e-2)] {
            let (sa, sb) = strided_spec(m, n, k);
            let plain =
                BmmSpec { a: sa, b: sb, batch: vec![2], m, n, k, bias: None, activation: None, activation_grad: None };
            let grad = BmmSpec { activation_grad: Some(Activation::GeluTanh), ..plain.clone() };
            let bytes = |seed: u64, len: usize| HostData::from_f64_slice(dtype, &randoms(seed, len.max(1))).to_bytes();
            let (a, b, aux) = (bytes(1, 2 * k * m), bytes(2, k * n), bytes(3, 2 * m * n));
            let out_len = 2 * m * n * dtype.size_bytes();
            let (wa, wb, waux) = (aligned(&a), aligned(&b), aligned(&aux));
            let view = |w: &[u64], len: usize| bytemuck::cast_slice::<u64, u8>(w)[..len].to_vec();
            let (a, b, aux) = (view(&wa, a.len()), view(&wb, b.len()), view(&waux, aux.len()));
            let mut words = vec![0u64; out_len.div_ceil(8)];
            let out = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..out_len];
            super::gemm::bmm_bytes(&plain, dtype, &a, &b, &[], out).unwrap();
            let product = HostData::from_bytes(dtype, out).unwrap().to_f64_vec();
            super::gemm::bmm_bytes_grad(&grad, dtype, &a, &b, &aux, out).unwrap();
            let got = HostData::from_bytes(dtype, out).unwrap().to_f64_vec();
            let saved = HostData::from_bytes(dtype, &aux).unwrap().to_f64_vec();
            for (i, ((g, p), x)) in got.iter().zip(&product).zip(&saved).enumerate() {
                let expect = p * Activation::GeluTanh.grad_f64(*x);
                assert!((g - expect).abs() <= tol * (1.0 + expect.abs()), "{dtype} k={k} element {i}: {g} vs {expect}");
            }
            assert_eq!(
                super::gemm::bmm_bytes_grad(&grad, dtype, &a, &b, &aux[1..], out).unwrap_err().kind,
                ErrorKind::Runtime
            );
            assert_eq!(super::gemm::bmm_bytes(&grad, dtype, &a, &b, &[], out).unwrap_err().kind, ErrorKind::Runtime);
        }
    }
}

/// `bytes` in u64 words (aligned for any element type).
fn aligned(bytes: &[u8]) -> Vec<u64> {
    let mut w = vec![0u64; bytes.len().div_ceil(8)];
    bytemuck::cast_slice_mut::<u64, u8>(&mut w)[..bytes.len()].copy_from_slice(bytes);
    w
}

/// A large launch runs in ranges on the pool: every index is computed once, and of two
/// failing indices the lower one is reported, however the threads were timed.
#[test]
fn a_launch_in_ranges_covers_every_index_and_reports_the_first_error() {
    let Some(cc) = cc() else { return };
    const SRC: &str = "#include <stdint.h>
void k(char *const *args, int64_t *status) {
    int32_t *out = (int32_t *)args[0];
    const int64_t *r = (const int64_t *)args[3];
    for (int64_t x = r[0]; x < r[1]; x++) {
        out[x] += 1;
        if ((x == 70001 || x == 190001) && status[0] == 0) { status[0] = 1; status[1] = x; status[2] = 7; }
    }
}
";
    let dir = TempDir::new("ranges");
    let (lib, _) = module::load_or_build(cc, SRC, &dir.0, &["k"]).unwrap();
    let kernel = lib.kernel("k").unwrap();
    let n = 200_000i64;
    assert!(n >= launch::PARALLEL_MIN_ELEMENTS * 4);
    let mut out = vec![0i32; n as usize];
    let args = [out.as_mut_ptr() as *mut u8, std::ptr::null_mut(), std::ptr::null_mut()];
    let status = unsafe { launch::launch(&kernel, &args, n, 1) };
    assert_eq!(status, [1, 70001, 7, 0]);
    assert!(out.iter().all(|&v| v == 1), "an index computed {} times", out.iter().find(|&&v| v != 1).unwrap());
    // A small launch is one call on this thread.
    let status = unsafe { launch::launch(&kernel, &args, 100, 1) };
    assert_eq!(status, [0; 4]);
    assert!(out[..100].iter().all(|&v| v == 2) && out[100] == 1);
}
