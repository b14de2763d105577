//! Iteration signatures and the index check of fusion: every node's index variables mapped into
//! a kernel's `(xindex, rindex)` space, so that "read at exactly the index it was written" is
//! an equality of simplified expressions.

use crate::lower::{flat, vars};
use coil_ir::kernel::{rindex, xindex, FusedKernel, KernelKind};
use coil_ir::loops::{range_var, reduction_var, LoopKind, LoopNode, LoopProgram, ScalarOp};
use coil_ir::sym::Expr;
use indexmap::IndexMap;

/// A node's (or group's) iteration signature `(xnumel, rnumel)` (docs/compiler.md, "Scheduler").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Sig {
    /// A library call or fallback: fuses with nothing.
    Extern,
    /// `numel` independent elements (expressions of the size symbols, if any).
    Pointwise(Expr),
    /// `x` rows of `r` elements each.
    Reduction(Expr, Expr),
}

fn numel(ranges: &[Expr]) -> Expr {
    ranges.iter().copied().product()
}

impl Sig {
    pub(crate) fn of(node: &LoopNode) -> Sig {
        match &node.kind {
            LoopKind::Pointwise { ranges, .. } => Sig::Pointwise(numel(ranges)),
            LoopKind::Reduction { ranges, reduction_ranges, .. } => {
                Sig::Reduction(numel(ranges), numel(reduction_ranges))
            }
            LoopKind::Extern { .. } => Sig::Extern,
        }
    }

    /// The signature of two groups run as one kernel, if they can be: equal signatures, or a
    /// pointwise group of `x * r` (per-element) or `x` (per-row) elements with rows `(x, r)`.
    pub(crate) fn merge(self, other: Sig) -> Option<Sig> {
        match (self, other) {
            (Sig::Extern, _) | (_, Sig::Extern) => None,
            (a, b) if a == b => Some(a),
            (Sig::Pointwise(n), Sig::Reduction(x, r)) | (Sig::Reduction(x, r), Sig::Pointwise(n))
                if n == x * r || n == x =>
            {
                Some(Sig::Reduction(x, r))
            }
            _ => None,
        }
    }

    /// The kernel signature of a scheduled kernel.
    pub(crate) fn of_kernel(k: &FusedKernel) -> Sig {
        match (k.kind, &k.rnumel) {
            (KernelKind::Extern, _) => Sig::Extern,
            (_, Some(r)) => Sig::Reduction(k.xnumel, *r),
            (_, None) => Sig::Pointwise(k.xnumel),
        }
    }
}

/// `index` (a flat index over `shape`) split into one index per dim. The divisions are
/// successive, innermost dim first (`i % n`, then `i // n` for the rest): each step is one the
/// simplifier can see through (`(16*xindex + rindex) // 16` is `xindex`), where a single
/// `(16*xindex + rindex) // 128` would stay opaque.
pub(crate) fn delinearize(index: Expr, shape: &[Expr]) -> Vec<Expr> {
    let mut rest = index;
    let mut out = vec![Expr::int(0); shape.len()];
    for d in (0..shape.len()).rev() {
        let n = shape[d];
        out[d] = if d == 0 { rest } else { rest.modulo(n) };
        rest = rest.floor_div(n);
    }
    out
}

/// Adds `vars[i] -> values[i]` for the dims that have a variable.
fn bind(map: &mut IndexMap<Expr, Expr>, vars: &[Expr], values: Vec<Expr>) {
    for (&v, e) in vars.iter().zip(values) {
        if v.const_value().is_none() {
            map.insert(v, e);
        }
    }
}

/// The substitution taking `node`'s index variables to expressions over the kernel's `xindex`
/// (and `rindex`), for a kernel of signature `sig` (docs/compiler.md, "Kernel IR"):
/// a pointwise kernel delinearizes `xindex` over the node's ranges; in a reduction kernel a
/// reduction node's `x*` come from `xindex` and its `r*` from `rindex`, a per-element node's
/// flat index is `xindex * rnumel + rindex`, a per-row node's is `xindex`.
///
/// Empty for nodes or kernels without elements (they have no index to map).
pub(crate) fn index_map(node: &LoopNode, sig: Sig) -> IndexMap<Expr, Expr> {
    let mut map = IndexMap::new();
    let (x, r) = match sig {
        Sig::Extern => return map,
        Sig::Pointwise(x) => (x, Expr::int(1)),
        Sig::Reduction(x, r) => (x, r),
    };
    let zero = Expr::int(0);
    if x == zero || r == zero {
        return map;
    }
    let xi = xindex(&x);
    match &node.kind {
        LoopKind::Pointwise { ranges, .. } if numel(ranges) != zero => {
            let linear = if numel(ranges) == x { xi } else { xi * r + rindex(&r) };
            bind(&mut map, &vars(ranges, range_var), delinearize(linear, ranges));
        }
        LoopKind::Reduction { ranges, reduction_ranges, .. } => {
            bind(&mut map, &vars(ranges, range_var), delinearize(xi, ranges));
            let ri = rindex(&r);
            let rv = vars(reduction_ranges, reduction_var);
            bind(&mut map, &rv, delinearize(ri, reduction_ranges));
        }
        _ => {}
    }
    map
}

/// The index `node` writes its output at, in kernel space (`map` from [`index_map`]).
pub(crate) fn write_index(node: &LoopNode, map: &IndexMap<Expr, Expr>) -> Expr {
    let ranges = node.ranges();
    flat(&vars(ranges, range_var), ranges).substitute(map)
}

/// The index map of a scheduled kernel's member node: how `node` (an index into
/// `program.nodes`, a member of `kernel`) indexes in terms of `xindex` / `rindex`
/// ([`coil_ir::kernel::xindex`], [`coil_ir::kernel::rindex`]). Keys are the node's index
/// variables ([`range_var`], [`reduction_var`]; dims of extent 1 have none).
pub fn kernel_index_map(program: &LoopProgram, kernel: &FusedKernel, node: usize) -> IndexMap<Expr, Expr> {
    index_map(&program.nodes[node], Sig::of_kernel(kernel))
}

/// Why a read of a buffer written in the same kernel cannot become the producing value:
/// data-dependent and masked reads, reads at another index than the one written, and any read
/// of a scatter's output ([`coil_ir::loops::ScatterStore`]: it is written at data-dependent
/// places); nor may a scatter's base be written in its kernel (the runtime copies the base
/// into the output before the kernel runs).
pub(crate) fn reads_match(
    program: &LoopProgram,
    members: &[usize],
    producer_of: &[Option<usize>],
    map: &mut dyn FnMut(usize) -> IndexMap<Expr, Expr>,
) -> bool {
    let mut writes: IndexMap<usize, Expr> = IndexMap::new();
    let member = |b: coil_ir::loops::BufferId| producer_of[b.0].filter(|p| members.binary_search(p).is_ok());
    for &c in members {
        if program.nodes[c].scatter().is_some_and(|s| member(s.base).is_some()) {
            return false;
        }
    }
    for &c in members {
        let body = match &program.nodes[c].kind {
            LoopKind::Pointwise { body, .. } | LoopKind::Reduction { body, .. } => body,
            LoopKind::Extern { .. } => continue,
        };
        let mut read_map = None;
        for v in &body.values {
            let (buffer, index) = match &v.op {
                ScalarOp::Load { buffer, index } => (*buffer, Some(*index)),
                ScalarOp::MaskedLoad { buffer, .. } | ScalarOp::IndirectLoad { buffer, .. } => (*buffer, None),
                _ => continue,
            };
            let Some(p) = member(buffer) else { continue };
            let Some(index) = index.filter(|_| program.nodes[p].scatter().is_none()) else { return false };
            let read = index.substitute(read_map.get_or_insert_with(|| map(c)));
            let written = *writes.entry(p).or_insert_with(|| write_index(&program.nodes[p], &map(p)));
            if read != written {
                return false;
            }
        }
    }
    true
}
