//! The sorted scatter (`coil_codegen::templates::scatter`, with the argsort template grouping
//! its index) run on the host: both templates compiled by `g++` with the CUDA built-ins they
//! use emulated (a thread per CUDA thread, a real block barrier; the 16-bit conversions of
//! `attention_emulation.h`), launched as [`super::scatter`] launches them, by the same
//! [`SortedScatter`] and [`SortPlan`] (`scatter_emulation_main.cpp`, on cut grids), and
//! compared bit for bit with the reference interpreter's scatter on random data (never zero)
//! with many repeated indices: rows scatters (an embedding's gradient) and a sort per column,
//! every float dtype and reduction, several tiles and merge passes. Skipped (passing) without
//! a host `g++`.

use crate::cuda::emulation_build::build_emulator;
use crate::{interpret, Buffer, HostData};
use coil_codegen::templates::scatter::{ScatterDims, SortedScatter, SOURCE};
use coil_codegen::templates::{sort, BLOCK_EMULATION};
use coil_ir::{DType, Graph, Op, ReduceOp};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// The emulated templates' executable, built once per test run; `None` without g++ (each
/// caller told the test is skipped).
fn emulator() -> Option<&'static PathBuf> {
    static EXE: OnceLock<Option<PathBuf>> = OnceLock::new();
    let unit = || {
        let parts = [
            BLOCK_EMULATION,
            include_str!("attention_emulation.h"),
            sort::SOURCE,
            SOURCE,
            include_str!("scatter_emulation_main.cpp"),
        ];
        parts.join("\n")
    };
    EXE.get_or_init(|| build_emulator("scatter", &unit(), &["-fno-strict-aliasing", "-Wno-unknown-pragmas"])).as_ref()
}

/// A xorshift stream.
struct Stream(u64);

impl Stream {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A float of magnitude in [0.25, 2) and either sign: never zero.
    fn value(&mut self) -> f64 {
        let m = 0.25 + (self.next() >> 11) as f64 / (1u64 << 53) as f64 * 1.75;
        if self.next() & 1 == 0 {
            m
        } else {
            -m
        }
    }
}

/// A buffer of `shape` of random floats of `dtype`.
fn floats(shape: &[usize], dtype: DType, s: &mut Stream) -> Buffer {
    let v: Vec<f64> = (0..shape.iter().product()).map(|_| s.value()).collect();
    Buffer::new(shape.to_vec(), HostData::from_f64_slice(dtype, &v)).unwrap()
}

/// An index of `shape` with values in `0..targets` (few: they repeat), the same along the dims
/// after `dim` when `rows` (an expanded index); `bad` replaces one element with an index out
/// of range.
fn index(shape: &[usize], dim: usize, targets: usize, rows: bool, bad: Option<i64>, s: &mut Stream) -> Buffer {
    let inner: usize = shape.get(dim + 1..).map_or(1, |after| after.iter().product());
    let n: usize = shape.iter().product();
    let mut v: Vec<i64> = Vec::with_capacity(n);
    for e in 0..n {
        let value = if rows && e % inner != 0 { v[e - e % inner] } else { (s.next() % targets as u64) as i64 };
        v.push(value);
    }
    if let Some(bad) = bad {
        // (A whole row where the index repeats along rows: it still does.)
        let at = n / 2;
        let run = if rows { at - at % inner..at - at % inner + inner } else { at..at + 1 };
        v[run].fill(bad);
    }
    Buffer::new(shape.to_vec(), HostData::from_i64_slice(DType::I64, &v)).unwrap()
}

/// Runs the emulated scatter (`vectors`: by the rows kernel where the plan allows); returns the
/// output's bytes and the 4 status words.
#[allow(clippy::too_many_arguments)]
fn emulate(
    exe: &PathBuf,
    x: &Buffer,
    i: &Buffer,
    src: &Buffer,
    dim: usize,
    reduce: ReduceOp,
    rows: bool,
    vectors: bool,
) -> (Vec<u8>, [i64; 4]) {
    let (xm, im, sm) = (x.meta(), i.meta(), src.meta());
    let mut plan = SortedScatter::new(&xm, &im, &sm, dim, Some(reduce), rows).unwrap();
    if !vectors {
        plan.vector = 1;
    }
    let sort = plan.sort_plan().unwrap();
    let ([gx, _], [bx, by]) = plan.combine_launch();
    let d = ScatterDims::new(&xm, &im, &sm);
    let name = plan.kernel();
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    let tag = format!("{name}_{:?}_{:?}_{dim}_{rows}_{call}", im.shape, xm.shape).replace([' ', ',', '[', ']'], "");
    let dir = exe.parent().unwrap();
    let file = |what: &str| dir.join(format!("{tag}.{what}"));
    let dims: Vec<u8> = [d.size, d.xstride, d.sstride].iter().flatten().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(file("dims"), dims).unwrap();
    std::fs::write(file("x"), x.data.to_bytes()).unwrap();
    std::fs::write(file("index"), i.data.to_bytes()).unwrap();
    std::fs::write(file("src"), src.data.to_bytes()).unwrap();
    let ndim = xm.rank().max(1);
    let numbers =
        [name, ndim.to_string(), dim.to_string(), plan.outer.to_string(), plan.len.to_string(), plan.inner.to_string()];
    let more = [plan.rows as usize, plan.vector, plan.dim_size, gx as usize, bx as usize, by as usize];
    let more = more.into_iter().chain([sort.tiles, sort.width, sort.threads]);
    let status = Command::new(exe)
        .args(numbers)
        .args(more.map(|v| v.to_string()))
        .args([file("dims"), file("x"), file("index"), file("src"), file("out")])
        .args(sort.merges.iter().map(|r| r.to_string()))
        .status()
        .unwrap();
    assert!(status.success(), "{tag}: the emulation failed ({status})");
    let bytes = std::fs::read(file("out")).unwrap();
    let (out, words) = bytes.split_at(bytes.len() - 32);
    let word = |k: usize| i64::from_le_bytes(words[8 * k..8 * k + 8].try_into().unwrap());
    (out.to_vec(), [word(0), word(1), word(2), word(3)])
}

/// The interpreter's `scatter_reduce(x, dim, index, src)`, as bytes.
fn interpreted(x: &Buffer, i: &Buffer, src: &Buffer, dim: usize, reduce: ReduceOp) -> Vec<u8> {
    let mut g = Graph::new();
    let ids: Vec<_> = [x, i, src].iter().map(|b| g.input(b.meta())).collect();
    let y = g.push(Op::Scatter { dim, reduce: Some(reduce) }, &ids, None).unwrap();
    g.outputs.push(y);
    interpret(&g, &[x, i, src]).unwrap().remove(0).data.to_bytes()
}

/// The shapes of `x`, the index and `src`.
type Shapes<'a> = (&'a [usize], &'a [usize], &'a [usize]);

/// One scatter of these shapes in the emulation against the interpreter, bit for bit, with
/// about 4 sources a destination. With `rows` the index repeats along the dims after `dim`
/// and the emulation sorts its rows only (and combines by the rows kernel and the
/// per-element one, where the rows kernel serves); without, every column is sorted.
fn check(exe: &PathBuf, dtype: DType, reduce: ReduceOp, shapes: Shapes, dim: usize, rows: bool) {
    let (x, i, _) = shapes;
    let targets = x.get(dim).copied().unwrap_or(1).min(i.get(dim).copied().unwrap_or(1).div_ceil(4)).max(1);
    check_targets(exe, dtype, reduce, shapes, dim, rows, targets);
}

/// [`check`] with index values in `0..targets`.
fn check_targets(
    exe: &PathBuf,
    dtype: DType,
    reduce: ReduceOp,
    shapes: Shapes,
    dim: usize,
    rows: bool,
    targets: usize,
) {
    let (x, i, src) = shapes;
    let mut s = Stream(0x9e37_79b9_7f4a_7c15 ^ (x.iter().chain(i).sum::<usize>() as u64 * 7919 + dim as u64));
    let (xb, sb) = (floats(x, dtype, &mut s), floats(src, dtype, &mut s));
    let ib = index(i, dim, targets, rows, None, &mut s);
    let want = interpreted(&xb, &ib, &sb, dim, reduce);
    let plan = SortedScatter::new(&xb.meta(), &ib.meta(), &sb.meta(), dim, Some(reduce), rows).unwrap();
    for vectors in [true, false].into_iter().take(if plan.vector > 1 { 2 } else { 1 }) {
        let what = format!(
            "{dtype} {reduce:?} {x:?} {i:?} {src:?} dim {dim} rows {rows} vectors {}",
            vectors && plan.vector > 1
        );
        let (got, status) = emulate(exe, &xb, &ib, &sb, dim, reduce, rows, vectors);
        assert_eq!(status, [0; 4], "{what}: status");
        let size = dtype.size_bytes();
        let differs = |k: usize| got[k * size..(k + 1) * size] != want[k * size..(k + 1) * size];
        if let Some(k) = (0..want.len() / size).find(|&k| differs(k)) {
            let value = |b: &[u8]| HostData::from_bytes(dtype, &b[k * size..(k + 1) * size]).unwrap().to_f64_vec()[0];
            panic!("{what}: element {k} is {} where the interpreter has {}", value(&got), value(&want));
        }
    }
}

#[test]
fn the_sorted_scatter_is_the_interpreters_bit_for_bit() {
    let Some(exe) = emulator() else { return };
    for dtype in [DType::F32, DType::BF16, DType::F16, DType::F64] {
        for reduce in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min] {
            // An embedding's gradient: rows of src into rows of a table, sorted once per row
            // and, as if the index were not known to repeat, once per column.
            for rows in [true, false] {
                check(exe, dtype, reduce, (&[13, 40], &[97, 40], &[97, 40]), 0, rows);
            }
            // Along a middle dim, an index smaller than x and src along the other dims (rows
            // of whole vectors for f32 and f64, of none for the others; of none at all).
            for rows in [true, false] {
                check(exe, dtype, reduce, (&[3, 9, 4, 8], &[3, 17, 4, 4], &[3, 20, 5, 8]), 1, rows);
                check(exe, dtype, reduce, (&[3, 9, 4, 5], &[3, 17, 4, 2], &[3, 20, 5, 2]), 1, rows);
            }
            // Along the last dim (a gather's gradient): lines of one column.
            check(exe, dtype, reduce, (&[6, 11], &[6, 30], &[6, 31]), 1, false);
        }
    }
    // A 0-d scatter.
    check(exe, DType::F32, ReduceOp::Sum, (&[], &[], &[]), 0, false);
}

#[test]
fn long_lines_and_runs_sort_in_tiles_and_stage_in_chunks() {
    let Some(exe) = emulator() else { return };
    // 5000 rows over 50 targets (tiles of 2048, two merge passes), by rows and by columns.
    for (dtype, rows) in [(DType::F32, true), (DType::BF16, true), (DType::BF16, false)] {
        check(exe, dtype, ReduceOp::Sum, (&[50, 8], &[5000, 8], &[5000, 8]), 0, rows);
    }
    // Runs of about 130 rows (several chunks of staged positions), of about 300 in blocks of
    // 256 threads (chunks of 32 and 256), one of 64 (two whole chunks and an empty third), rows
    // wider than a block (several blocks along x).
    check_targets(exe, DType::F32, ReduceOp::Sum, (&[13, 40], &[400, 40], &[400, 40]), 0, true, 3);
    check_targets(exe, DType::F32, ReduceOp::Sum, (&[5, 1032], &[600, 1032], &[600, 1032]), 0, true, 2);
    check_targets(exe, DType::BF16, ReduceOp::Sum, (&[3, 16], &[64, 16], &[64, 16]), 0, true, 1);
    check(exe, DType::F32, ReduceOp::Sum, (&[7, 1032], &[20, 1032], &[20, 1032]), 0, true);
}
#[test]
fn an_index_out_of_range_is_reported_in_the_status_words() {
    let Some(exe) = emulator() else { return };
    for (bad, rows) in [(13i64, true), (-2, false), (40, false)] {
        let mut s = Stream(17);
        let (x, src) = (floats(&[13, 8], DType::F32, &mut s), floats(&[30, 8], DType::F32, &mut s));
        let i = index(&[30, 8], 0, 5, rows, Some(bad), &mut s);
        let (_, status) = emulate(exe, &x, &i, &src, 0, ReduceOp::Sum, rows, true);
        assert_eq!(status, [1, bad, 13, 0], "index {bad}");
    }
}
