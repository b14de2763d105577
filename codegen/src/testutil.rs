//! Test support: loop programs built by hand, the kernels of a few classic patterns, and a
//! harness that compiles generated C with the system compiler and calls its kernels.

use coil_ir::kernel::{FusedKernel, KernelKind, TileKernel};
use coil_ir::loops::{
    range_var, reduction_var, Body, BufferId, LoopBuffer, LoopKind, LoopNode, LoopProgram, ScalarOp, SizeSymbol,
    ValueId,
};
use coil_ir::sym::Expr;
use coil_ir::{BinaryOp, DType, ReduceOp, TensorMeta, UnaryOp};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A loop program under construction.
#[derive(Default)]
pub struct Prog {
    pub p: LoopProgram,
}

pub fn exprs(v: &[usize]) -> Vec<Expr> {
    v.iter().map(|&n| Expr::from(n)).collect()
}

/// The index variables `x0, x1, ...` of ranges `r`.
pub fn xs(r: &[usize]) -> Vec<Expr> {
    exprs(r).iter().enumerate().map(|(i, e)| range_var(i, e)).collect()
}

/// The reduction variables `r0, r1, ...` of reduction ranges `r`.
pub fn rs(r: &[usize]) -> Vec<Expr> {
    exprs(r).iter().enumerate().map(|(i, e)| reduction_var(i, e)).collect()
}

impl Prog {
    /// Declares the size symbol `name`: dim `dim` of input `input`, compiled at `hint`.
    pub fn symbol(&mut self, name: &str, input: usize, dim: usize, hint: i64) -> Expr {
        let symbol = Expr::size(name);
        self.p.symbols.push(SizeSymbol { symbol, input, dim, hint });
        symbol
    }

    /// A buffer of sizes `shape` (its meta at the symbols' hints).
    fn buffer(&mut self, name: String, shape: &[Expr], dtype: DType) -> BufferId {
        let hints = self.p.hints();
        let sizes: Vec<usize> =
            shape.iter().map(|e| e.eval(&hints).expect("symbols declared first") as usize).collect();
        self.p.buffers.push(LoopBuffer { name, meta: TensorMeta::new(sizes, dtype), shape: shape.to_vec() });
        BufferId(self.p.buffers.len() - 1)
    }

    pub fn input(&mut self, shape: &[usize], dtype: DType) -> BufferId {
        self.input_e(&exprs(shape), dtype)
    }

    /// An input of sizes `shape` (expressions of the size symbols).
    pub fn input_e(&mut self, shape: &[Expr], dtype: DType) -> BufferId {
        let b = self.buffer(format!("arg{}", self.p.inputs.len()), shape, dtype);
        self.p.inputs.push(b);
        b
    }

    fn node(&mut self, shape: &[Expr], dtype: DType, origins: Vec<&'static str>, kind: LoopKind) -> BufferId {
        let b = self.buffer(format!("buf{}", self.p.nodes.len()), shape, dtype);
        self.p.nodes.push(LoopNode { output: b, origins, kind });
        b
    }

    /// A pointwise node over `shape`.
    pub fn pointwise(&mut self, shape: &[usize], dtype: DType, body: Body) -> BufferId {
        self.pointwise_e(&exprs(shape), dtype, body)
    }

    /// A pointwise node over `shape` (expressions of the size symbols).
    pub fn pointwise_e(&mut self, shape: &[Expr], dtype: DType, body: Body) -> BufferId {
        let kind = LoopKind::Pointwise { ranges: shape.to_vec(), body, scatter: None };
        self.node(shape, dtype, vec!["pointwise"], kind)
    }

    /// A reduction node with output shape `ranges`.
    pub fn reduction(&mut self, ranges: &[usize], red: &[usize], op: ReduceOp, dtype: DType, body: Body) -> BufferId {
        self.reduction_e(&exprs(ranges), &exprs(red), op, dtype, body)
    }

    /// A reduction node with output shape `ranges` (expressions of the size symbols).
    pub fn reduction_e(&mut self, ranges: &[Expr], red: &[Expr], op: ReduceOp, dtype: DType, body: Body) -> BufferId {
        let kind = LoopKind::Reduction { ranges: ranges.to_vec(), reduction_ranges: red.to_vec(), op, body };
        self.node(ranges, dtype, vec![op.name()], kind)
    }

    pub fn output(&mut self, b: BufferId) {
        self.p.outputs.push(b);
    }
}

/// A body under construction: `push` appends (or finds) a value.
#[derive(Default)]
pub struct B(pub Body);

impl B {
    pub fn push(&mut self, op: ScalarOp, d: DType) -> ValueId {
        self.0.push(op, d)
    }
    pub fn load(&mut self, buffer: BufferId, index: Expr, d: DType) -> ValueId {
        self.push(ScalarOp::Load { buffer, index }, d)
    }
    pub fn unary(&mut self, op: UnaryOp, a: ValueId, d: DType) -> ValueId {
        self.push(ScalarOp::Unary(op, a), d)
    }
    pub fn binary(&mut self, op: BinaryOp, a: ValueId, b: ValueId, d: DType) -> ValueId {
        self.push(ScalarOp::Binary(op, a, b), d)
    }
    pub fn constant(&mut self, c: impl Into<coil_ir::Scalar>, d: DType) -> ValueId {
        self.push(ScalarOp::Constant(c.into()), d)
    }
    pub fn done(mut self, result: ValueId) -> Body {
        self.0.result = result;
        self.0
    }
}

pub fn kernel(
    name: &str,
    kind: KernelKind,
    nodes: Vec<usize>,
    xnumel: usize,
    rnumel: Option<usize>,
    stores: Vec<BufferId>,
) -> FusedKernel {
    kernel_e(name, kind, nodes, Expr::from(xnumel), rnumel.map(Expr::from), stores)
}

/// [`kernel`] with extents that may name size symbols.
pub fn kernel_e(
    name: &str,
    kind: KernelKind,
    nodes: Vec<usize>,
    xnumel: Expr,
    rnumel: Option<Expr>,
    stores: Vec<BufferId>,
) -> FusedKernel {
    FusedKernel { name: name.into(), kind, nodes, xnumel, rnumel, stores }
}

/// `softmax(x, dim=-1)` of an f32 `[rows, cols]` input as lowering produces it (amax; sum of the
/// inlined `exp(x - amax)`; the normalizing epilogue), fused into one kernel of `kind`.
pub fn softmax(rows: usize, cols: usize, kind: KernelKind, name: &str) -> (LoopProgram, FusedKernel) {
    let f = DType::F32;
    let mut p = Prog::default();
    let x = p.input(&[rows, cols], f);
    let (xv, rv) = (xs(&[rows])[0], rs(&[cols])[0]);
    let mut b = B::default();
    let l = b.load(x, xv * cols as i64 + rv, f);
    let amax = p.reduction(&[rows], &[cols], ReduceOp::Max, f, b.done(l));
    let mut b = B::default();
    let l = b.load(x, xv * cols as i64 + rv, f);
    let m = b.load(amax, xv, f);
    let d = b.binary(BinaryOp::Sub, l, m, f);
    let e = b.unary(UnaryOp::Exp, d, f);
    let sum = p.reduction(&[rows], &[cols], ReduceOp::Sum, f, b.done(e));
    let v = xs(&[rows, cols]);
    let mut b = B::default();
    let l = b.load(x, v[0] * cols as i64 + v[1], f);
    let m = b.load(amax, v[0], f);
    let d = b.binary(BinaryOp::Sub, l, m, f);
    let e = b.unary(UnaryOp::Exp, d, f);
    let s = b.load(sum, v[0], f);
    let q = b.binary(BinaryOp::Div, e, s, f);
    let out = p.pointwise(&[rows, cols], f, b.done(q));
    p.output(out);
    let k = kernel(name, kind, vec![0, 1, 2], rows, Some(cols), vec![out]);
    (p.p, k)
}

/// One pointwise kernel over f32 inputs `a` and `b` of 4 elements, five outputs where the sign
/// of a zero shows: `maximum(a, b)`, `minimum(a, b)`, `a * 0.0`, `a * -0.0` and
/// `(a + 0.0) / -0.0` (both zero constants in one body, and in one kernel).
pub fn signed_zeros() -> (LoopProgram, FusedKernel) {
    let f = DType::F32;
    let mut p = Prog::default();
    let (a, b_) = (p.input(&[4], f), p.input(&[4], f));
    let v = xs(&[4])[0];
    let mut outs = Vec::new();
    for which in 0..5 {
        let mut b = B::default();
        let (la, lb) = (b.load(a, v, f), b.load(b_, v, f));
        let r = match which {
            0 => b.binary(BinaryOp::Maximum, la, lb, f),
            1 => b.binary(BinaryOp::Minimum, la, lb, f),
            2 | 3 => {
                let zero = b.constant(if which == 2 { 0.0 } else { -0.0 }, f);
                b.binary(BinaryOp::Mul, la, zero, f)
            }
            _ => {
                let (zero, negative_zero) = (b.constant(0.0, f), b.constant(-0.0, f));
                let s = b.binary(BinaryOp::Add, la, zero, f);
                b.binary(BinaryOp::Div, s, negative_zero, f)
            }
        };
        outs.push(p.pointwise(&[4], f, b.done(r)));
    }
    outs.iter().for_each(|&o| p.output(o));
    (p.p, kernel("poi_fused_signed_zeros_0", KernelKind::Pointwise, (0..5).collect(), 4, None, outs))
}

/// Reference softmax of one row, in f64.
pub fn softmax_ref(row: &[f32]) -> Vec<f64> {
    let m = row.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
    let e: Vec<f64> = row.iter().map(|&v| (v as f64 - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|v| v / s).collect()
}

/// The input the softmax tests feed: `n` values in [-5, 5), not zeros.
pub fn softmax_input(n: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 7919) % 1000) as f32 / 100.0 - 5.0).collect()
}

/// Asserts that every row of `cols` values of `out` is the softmax of `x`'s row (within
/// 1e-6 relative); `what` names the case in the message.
pub fn assert_softmax_rows(x: &[f32], out: &[f32], cols: usize, what: &str) {
    for (r, (row, got)) in x.chunks(cols).zip(out.chunks(cols)).enumerate() {
        for (c, (&got, want)) in got.iter().zip(softmax_ref(row)).enumerate() {
            let got = got as f64;
            assert!((got - want).abs() <= 1e-6 * want.max(1e-3), "{what} [{r}, {c}]: {got} vs {want}");
        }
    }
}

/// A compiled and loaded translation unit; its directory goes when it is dropped (the library
/// stays loaded).
pub struct CLib {
    lib: Option<libloading::Library>,
    dir: PathBuf,
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// Compiles C source as the runtime will (`cc -O2 -ffp-contract=off -fno-math-errno
/// -fno-trapping-math -fopenmp-simd -shared -fPIC ... -lm`, warnings as errors) and loads it.
pub fn compile(src: &str) -> CLib {
    // COIL_TEST_CFLAGS replaces `-O2` (e.g. with the runtime's `-O3 -march=native`).
    compile_with(src, &std::env::var("COIL_TEST_CFLAGS").unwrap_or_else(|_| "-O2".into()))
}

/// [`compile`] with `opt` (e.g. `-O3 -march=native`) in place of `-O2`.
pub fn compile_with(src: &str, opt: &str) -> CLib {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("coil-codegen-test-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("src.c"), src).unwrap();
    let out = Command::new("cc")
        .args(opt.split_whitespace())
        .args([
            "-Wall",
            "-Werror",
            "-Wno-unknown-pragmas",
            "-ffp-contract=off",
            "-fno-math-errno",
            "-fno-trapping-math",
            "-fopenmp-simd",
            "-shared",
            "-fPIC",
            "-o",
            "lib.so",
            "src.c",
            "-lm",
        ])
        .current_dir(&dir)
        .output()
        .expect("running cc");
    assert!(out.status.success(), "cc failed:\n{}\n--- source ---\n{src}", String::from_utf8_lossy(&out.stderr));
    let lib = unsafe { libloading::Library::new(dir.join("lib.so")) }.expect("loading the kernel library");
    CLib { lib: Some(lib), dir }
}

impl CLib {
    /// The function `name` of the library, of type `F` (an `extern "C" fn`).
    ///
    /// # Safety
    /// `F` must be the C function's type.
    pub unsafe fn function<F: Copy>(&self, name: &str) -> F {
        *self.lib.as_ref().unwrap().get::<F>(name.as_bytes()).expect("symbol")
    }

    /// Calls kernel `name` on buffers `args`; returns the status words.
    pub fn run(&self, name: &str, args: &[*mut u8]) -> [i64; 4] {
        self.run_sized(name, args, &[])
    }

    /// Calls kernel `name` on buffers `args` and the values of its size symbols (the pointer
    /// after the buffers, as the runtime passes it); returns the status words.
    pub fn run_sized(&self, name: &str, args: &[*mut u8], sizes: &[i64]) -> [i64; 4] {
        self.run_with(name, args, sizes, &[])
    }

    /// Calls kernel `name` on buffers `args`, the values of its size symbols and its random
    /// streams' words (key, first counter, per stream), as the runtime passes them, over all of
    /// `xindex` (a null range); returns the status words.
    pub fn run_with(&self, name: &str, args: &[*mut u8], sizes: &[i64], random: &[u64]) -> [i64; 4] {
        self.run_range(name, args, sizes, random, None)
    }

    /// [`CLib::run_with`] over the `xindex` range `[start, end)` when given.
    pub fn run_range(
        &self,
        name: &str,
        args: &[*mut u8],
        sizes: &[i64],
        random: &[u64],
        range: Option<[i64; 2]>,
    ) -> [i64; 4] {
        let mut args = args.to_vec();
        args.push(sizes.as_ptr() as *mut u8);
        args.push(random.as_ptr() as *mut u8);
        args.push(range.as_ref().map_or(std::ptr::null_mut(), |r| r.as_ptr() as *mut u8));
        let mut status = [0i64; 4];
        unsafe {
            let f: libloading::Symbol<unsafe extern "C" fn(*const *mut u8, *mut i64)> =
                self.lib.as_ref().unwrap().get(name.as_bytes()).expect("kernel symbol");
            f(args.as_ptr(), status.as_mut_ptr());
        }
        status
    }
}

impl Drop for CLib {
    /// Removes the files but never unloads the library (as the runtime never does).
    fn drop(&mut self) {
        std::mem::forget(self.lib.take());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Compiles the kernels (built from `program`) and returns the library with the tile kernels.
pub fn build_and_compile(program: &LoopProgram, kernels: &[FusedKernel]) -> (CLib, Vec<TileKernel>) {
    let tiles: Vec<TileKernel> = kernels.iter().map(|k| crate::build_kernel(program, k)).collect();
    (compile(&crate::emit_c(&tiles)), tiles)
}

/// A mutable pointer to a vector's bytes, for a kernel argument.
pub fn ptr<T>(v: &mut [T]) -> *mut u8 {
    v.as_mut_ptr() as *mut u8
}

/// `x.sum(dim)` of f32 `[rows, cols]`, `dim` 0 or 1.
pub fn sum_dim(rows: usize, cols: usize, dim: usize, kind: KernelKind) -> (LoopProgram, FusedKernel) {
    let f = DType::F32;
    let mut p = Prog::default();
    let x = p.input(&[rows, cols], f);
    let (outs, red) = if dim == 0 { (cols, rows) } else { (rows, cols) };
    let (xv, rv) = (xs(&[outs])[0], rs(&[red])[0]);
    let index = if dim == 0 { rv * cols as i64 + xv } else { xv * cols as i64 + rv };
    let mut b = B::default();
    let l = b.load(x, index, f);
    let s = p.reduction(&[outs], &[red], ReduceOp::Sum, f, b.done(l));
    p.output(s);
    (p.p, kernel("per_fused_sum_0", kind, vec![0], outs, Some(red), vec![s]))
}
