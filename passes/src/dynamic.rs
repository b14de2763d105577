//! The front half of a dynamic-shape compile: a captured graph whose sizes are expressions of
//! size symbols becomes a primitive graph with symbolic sizes, ready for
//! [`crate::lower::lower_dynamic`].
//!
//! Decomposition and simplification work on concrete sizes, so they run on copies of the
//! captured graph at probe sizes (see [`coil_ir::dynamic`]): at `2^k` probes (symbol `i` at
//! `1009 + 100 i` or one more) the primitive graphs must agree up to sizes, every size number
//! of theirs is decoded as a multilinear polynomial in the symbols, and the decoding is checked
//! at one more point (each symbol 37 above its base). Probe sizes are large, so no pass treats
//! a symbolic dim as 0 or 1 (coil specializes those sizes: symbols are at least 2). When any
//! step fails, the caller compiles the graph for static sizes instead; the error says why.
//!
//! ```
//! use coil_ir::dynamic::SymSizes;
//! use coil_ir::sym::Expr;
//! use coil_ir::{DType, Graph, Op, TensorMeta, UnaryOp};
//! use coil_passes::dynamic::generalize;
//! let mut g = Graph::new();
//! let x = g.input(TensorMeta::new(vec![5, 8], DType::F32));
//! let y = g.push(Op::Softmax { dim: 1 }, &[x], None).unwrap();
//! g.outputs.push(y);
//! // Dim 0 of the input is the symbol s0; everything else static.
//! let s0 = Expr::size("s0");
//! let mut sizes = SymSizes::constant(&g);
//! sizes.nodes[0][0] = s0;
//! sizes.nodes[1][0] = s0;
//! let d = generalize(&g, &sizes, &[s0], &coil_passes::RewriteOptions::default()).unwrap();
//! // Every node of the primitive graph has s0 rows.
//! assert!(d.sizes.nodes.iter().all(|n| n.first().map_or(true, |&r| r == s0 || r == Expr::int(1))));
//! ```

use crate::decompose::DecomposeOptions;
use crate::rewrite::{simplify, RewriteOptions, RewriteReport};
use crate::templates::TemplateReport;
use coil_ir::dynamic::{instantiate, same_up_to_sizes, Probe, SymSizes};
use coil_ir::sym::Expr;
use coil_ir::Graph;

/// A primitive graph and its sizes as expressions of the size symbols.
#[derive(Clone, Debug)]
pub struct DynamicGraph {
    /// The primitive graph at the first probe (its metas are probe sizes, not the call's).
    pub primitive: Graph,
    /// The size numbers of `primitive` (shapes and size attributes, per node) as expressions
    /// of the size symbols: evaluated at a call's sizes, they give that call's graph.
    pub sizes: SymSizes,
    /// The rewrite report of the first probe.
    pub rewrites: RewriteReport,
    /// The template stage's report of the first probe (its costs at the probe's sizes), when
    /// it ran.
    pub templates: Option<TemplateReport>,
}

/// Decomposes (the reference decomposition) and simplifies `captured` (whose size numbers are
/// `sizes`, in `symbols`) for every size at once; see the module docs.
pub fn generalize(
    captured: &Graph,
    sizes: &SymSizes,
    symbols: &[Expr],
    options: &RewriteOptions,
) -> Result<DynamicGraph, String> {
    generalize_with(captured, sizes, symbols, options, &DecomposeOptions::default())
}

/// [`generalize`] with the compile path's decomposition choices. The attention pattern is
/// matched at every probe (it depends on no size, only on head dims, which a template keeps
/// static), so a kept template node is the same at every probe, its sizes (L, S) expressions
/// like any other; a graph where that is not so fails the probes' agreement and compiles static.
pub fn generalize_with(
    captured: &Graph,
    sizes: &SymSizes,
    symbols: &[Expr],
    options: &RewriteOptions,
    decomposition: &DecomposeOptions,
) -> Result<DynamicGraph, String> {
    if symbols.is_empty() || symbols.len() > 3 {
        return Err(format!("{} size symbols (1 to 3 are supported)", symbols.len()));
    }
    let probe = Probe::new(symbols.to_vec(), (0..symbols.len() as i64).map(|i| 1009 + 100 * i).collect());
    // The template stage costs at the rewrite pass's rates (the compiling target's).
    type Front = (Graph, RewriteReport, Option<TemplateReport>);
    let front = |values: &[i64]| -> Result<Front, String> {
        let g = instantiate(captured, sizes, &probe, values).map_err(|e| e.to_string())?;
        let (primitive, templates) =
            crate::decompose_for(&g, decomposition, &options.model).map_err(|e| e.to_string())?;
        let (g, rewrites) = simplify(&primitive, options).map_err(|e| e.to_string())?;
        Ok((g, rewrites, templates))
    };
    let mut graphs = Vec::with_capacity(probe.count());
    let mut first = None;
    for mask in 0..probe.count() {
        let (g, rewrites, templates) = front(&probe.point(mask))?;
        if graphs.first().is_some_and(|first| !same_up_to_sizes(first, &g)) {
            return Err("the compiled program changes with the sizes (probes disagree)".into());
        }
        first.get_or_insert((rewrites, templates));
        graphs.push(g);
    }
    let decoded =
        SymSizes::decode(&probe, &graphs).ok_or("a size is not a polynomial in the size symbols".to_string())?;
    let check: Vec<i64> = probe.base.iter().map(|b| b + 37).collect();
    let (at_check, _, _) = front(&check)?;
    if !same_up_to_sizes(&graphs[0], &at_check) || !decoded.matches(&probe, &check, &at_check) {
        return Err("a size is not a multilinear polynomial in the size symbols".into());
    }
    let (rewrites, templates) = first.expect("at least one probe");
    Ok(DynamicGraph { primitive: graphs.swap_remove(0), sizes: decoded, rewrites, templates })
}

#[cfg(test)]
mod tests {
    use super::*;
    use coil_ir::loops::SizeSymbol;
    use coil_ir::{DType, Op, TensorMeta};

    /// layer_norm over `[5, s0, 64]` and a mean over the first two dims: the program reads
    /// with `s0` in its strides and divides the mean by `5*s0` computed at run time.
    #[test]
    fn lowers_layer_norm_and_a_mean_with_a_symbolic_dim() {
        let mut g = Graph::new();
        let x = g.input(TensorMeta::new(vec![5, 3, 64], DType::BF16));
        let w = g.input(TensorMeta::new(vec![64], DType::BF16));
        let b = g.input(TensorMeta::new(vec![64], DType::BF16));
        let y = g.push(Op::LayerNorm { ndim: 1, eps: 1e-5, weight: true, bias: true }, &[x, w, b], None).unwrap();
        let m = g.push(Op::Mean { dims: vec![0, 1], keepdim: false }, &[y], None).unwrap();
        g.outputs.extend([y, m]);
        let s0 = Expr::size("s0");
        let mut sizes = SymSizes::constant(&g);
        sizes.nodes[0][1] = s0;
        sizes.nodes[3][1] = s0;
        let d = generalize(&g, &sizes, &[s0], &RewriteOptions::default()).unwrap();
        let symbols = vec![SizeSymbol { symbol: s0, input: 0, dim: 1, hint: 3 }];
        let p = crate::lower_dynamic(&d.primitive, &d.sizes, symbols).unwrap();
        let text = p.to_string();
        assert!(text.starts_with("symbol s0 = arg0.size(1) (hint 3)\n"), "{text}");
        assert!(text.contains("arg0: bf16[5, s0, 64]"), "{text}");
        assert!(text.contains("load(arg0, r0 + 64*x1 + 64*s0*x0)"), "{text}");
        assert!(text.contains("index(5*s0)"), "the mean's count: {text}");
        // Buffer metas are at the hint.
        assert_eq!(p.buffers[p.outputs[0].0].meta.shape, vec![5, 3, 64]);
        let schedule = crate::schedule(&p);
        let kernels: Vec<String> = schedule.kernels.iter().map(|k| format!("{} {}", k.kind.name(), k.xnumel)).collect();
        assert_eq!(kernels, ["persistent_reduction 5*s0", "looped_reduction 64"]);
        // The program at s0 = 7.
        let at = p.instantiate(&p.bind(&[&[5, 7, 64], &[64], &[64]]).unwrap());
        assert_eq!(at.buffers[at.outputs[0].0].meta.shape, vec![5, 7, 64]);
        assert!(p.bind(&[&[5, 1, 64], &[64], &[64]]).is_err(), "sizes below 2 are specialized");
    }

    #[test]
    fn refuses_sizes_that_are_not_polynomials() {
        // A reshape to [s0 / 2, 2]: the probes cannot even build it.
        let mut g = Graph::new();
        let x = g.input(TensorMeta::new(vec![4], DType::F32));
        let y = g.push(Op::Reshape { shape: vec![2, 2] }, &[x], None).unwrap();
        g.outputs.push(y);
        let s0 = Expr::size("s0");
        let mut sizes = SymSizes::constant(&g);
        sizes.nodes[0][0] = s0;
        assert!(generalize(&g, &sizes, &[s0], &RewriteOptions::default()).is_err());
    }
}
