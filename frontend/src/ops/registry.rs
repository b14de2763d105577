//! The op registry: every user-facing op, how coil computes it, and whether it has a gradient.
//!
//! This table (its rows are in `registry_math.rs` and `registry_layout.rs`) is the one list of
//! coil's ops. `docs/ops.md` is generated from it (with the golden cases counted from
//! `tests/golden/cases.json`) by `tests/ops_table.rs`, which fails when the committed file is
//! stale. An op added without a row here is missing from the documentation, and a row without
//! golden cases shows as such in the table.

#[path = "registry_layout.rs"]
mod layout_rows;
#[path = "registry_math.rs"]
mod math_rows;

/// Which part of the API an op belongs to (the sections of `docs/ops.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Family {
    /// Constants, ranges, random numbers, data.
    Creation,
    /// Elementwise math.
    Pointwise,
    /// Activation functions.
    Activation,
    /// Reductions and scans.
    Reduction,
    /// Views, indexing and data movement.
    Shape,
    /// Linear algebra (products).
    Linalg,
    /// Neural-network functions (embedding, attention, dropout, ...).
    Nn,
    /// Losses and distances.
    Loss,
    /// Normalization, pooling and resampling.
    Vision,
}

impl Family {
    /// The heading of this family's section in `docs/ops.md`.
    ///
    /// ```
    /// use coil_frontend::ops::registry::Family;
    /// assert_eq!(Family::Loss.title(), "Losses and distances");
    /// ```
    pub fn title(self) -> &'static str {
        match self {
            Family::Creation => "Creation and random",
            Family::Pointwise => "Pointwise",
            Family::Activation => "Activations",
            Family::Reduction => "Reductions",
            Family::Shape => "Views, indexing and data movement",
            Family::Linalg => "Linear algebra",
            Family::Nn => "Neural-network functions",
            Family::Loss => "Losses and distances",
            Family::Vision => "Normalization, pooling and resampling",
        }
    }
}

/// How coil computes an op; the text lists the primitives (or composite ops) it becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum How {
    /// A leaf of the graph: constants, ranges, random numbers, data.
    Leaf(&'static str),
    /// One primitive node.
    Primitive(&'static str),
    /// One composite node, decomposed into primitives by `coil-passes` (captured graphs show
    /// the op by name).
    Decomposed(&'static str),
    /// Written in the frontend as a composition of other ops (captured graphs show its parts).
    Frontend(&'static str),
    /// A hand-written kernel template where one applies, else a decomposition.
    Template(&'static str),
    /// Computed on the host from values read there: the output's shape depends on the data, so
    /// inside a compiled function the op is a graph break.
    Host(&'static str),
}

impl How {
    /// How the table names this way of computing an op.
    ///
    /// ```
    /// use coil_frontend::ops::registry::How;
    /// assert_eq!(How::Frontend("mul").kind(), "frontend composition");
    /// ```
    pub fn kind(self) -> &'static str {
        match self {
            How::Leaf(_) => "leaf",
            How::Primitive(_) => "primitive",
            How::Decomposed(_) => "decomposed",
            How::Frontend(_) => "frontend composition",
            How::Template(_) => "template",
            How::Host(_) => "host (graph break)",
        }
    }

    /// The primitives or ops it becomes.
    ///
    /// ```
    /// use coil_frontend::ops::registry::How;
    /// assert_eq!(How::Primitive("add").parts(), "add");
    /// ```
    pub fn parts(self) -> &'static str {
        match self {
            How::Leaf(s)
            | How::Primitive(s)
            | How::Decomposed(s)
            | How::Frontend(s)
            | How::Template(s)
            | How::Host(s) => s,
        }
    }
}

/// Whether [`crate::grad`] differentiates an op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grad {
    /// Differentiable.
    Yes,
    /// Piecewise constant: the gradient is zero almost everywhere (as in PyTorch).
    Zero,
    /// No gradient: integer or bool results, random numbers, constants.
    None,
    /// Differentiable in PyTorch, not in coil yet.
    Unsupported(&'static str),
}

/// One user-facing op.
#[derive(Clone, Copy, Debug)]
pub struct OpInfo {
    /// PyTorch's name (`torch.X`, `Tensor.X` or `F.X`), which golden case names start with.
    pub name: &'static str,
    /// How coil spells it.
    pub api: &'static str,
    /// The section of `docs/ops.md` it is listed in.
    pub family: Family,
    /// How coil computes it.
    pub how: How,
    /// Whether gradients flow through it.
    pub grad: Grad,
    /// Golden case-name prefixes of this op besides `name` (`div_floor` for `floor_divide`).
    pub case_prefixes: &'static [&'static str],
}

pub(crate) const fn op(
    name: &'static str,
    api: &'static str,
    family: Family,
    how: How,
    grad: Grad,
    case_prefixes: &'static [&'static str],
) -> OpInfo {
    OpInfo { name, api, family, how, grad, case_prefixes }
}

/// Every user-facing op, by family. Every op runs on the interpreter, the compiled CPU backend
/// and CUDA: they all lower to the same primitives.
pub const FAMILIES: &[(Family, &[OpInfo])] = &[
    (Family::Creation, math_rows::CREATION),
    (Family::Pointwise, math_rows::POINTWISE),
    (Family::Activation, math_rows::ACTIVATION),
    (Family::Reduction, math_rows::REDUCTION),
    (Family::Shape, layout_rows::SHAPE),
    (Family::Linalg, layout_rows::LINALG),
    (Family::Nn, layout_rows::NN),
    (Family::Loss, layout_rows::LOSS),
    (Family::Vision, layout_rows::VISION),
];

/// Every user-facing op, family by family.
///
/// ```
/// use coil_frontend::ops::registry::{ops, Family};
/// assert!(ops().any(|o| o.name == "einsum" && o.family == Family::Linalg));
/// ```
pub fn ops() -> impl Iterator<Item = &'static OpInfo> {
    FAMILIES.iter().flat_map(|(_, rows)| rows.iter())
}

/// PyTorch ops coil does not have yet, with what they need: `docs/ops.md` lists them after
/// the table, so that the gaps are as visible as the ops.
pub const NOT_YET: &[(&str, &str)] = &[
    ("kthvalue, median, mode, msort, randperm", "expressible with argsort (as sort and topk are); not done yet"),
    (
        "cumulative ops over long rows",
        "a scan primitive: cummax, cummin, logcumsumexp and cumprod are prefix-mask reductions, n^2 per row",
    ),
    ("embedding_bag max with offsets", "expressible with scatter_reduce amax; not done yet"),
    ("bincount", "a data-dependent output shape (its length is the largest value): a host op as `unique` is"),
    ("max_unpool, pooling with return_indices", "indices of window maxima: expressible, not done yet"),
    ("grid_sample with reflection padding or bicubic, 3-D affine_grid", "expressible; not done yet"),
    ("batch_norm in training with running statistics", "an in-place update of the running statistics"),
    (
        "inverse, solve, det, slogdet, svd, qr, cholesky, eig, pinv, matrix_norm ord 2/nuc, matrix_power n < 0",
        "matrix factorizations",
    ),
];

#[cfg(test)]
mod tests {
    use super::{ops, FAMILIES};

    #[test]
    fn op_names_are_unique_and_plain() {
        for (family, rows) in FAMILIES {
            assert!(rows.iter().all(|o| o.family == *family), "a {family:?} row in another family's table");
        }
        let mut names: Vec<&str> = ops().map(|o| o.name).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(before, names.len(), "an op is registered twice");
        for o in ops() {
            assert!(o.name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'), "{}", o.name);
            assert!(!o.api.is_empty() && !o.how.parts().is_empty(), "{}", o.name);
        }
    }
}
