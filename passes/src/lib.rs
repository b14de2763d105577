//! `coil-passes`: graph-to-graph passes and the steps from a primitive graph to fused kernels:
//! decomposition to primitives, lowering to loop IR, and the fusion scheduler with its memory
//! plan, with e-graph simplification between decomposition and lowering.
//!
//! It owns:
//! * the decomposition table ([`mod@decompose`], entry point [`decompose()`]), which turns a
//!   captured graph (composite ops such as softmax, layer_norm, gelu, cross_entropy, linear and
//!   attention; Rust scalars; implicit broadcasting and type promotion) into a primitive graph
//!   that satisfies [`coil_ir::Graph::verify_primitive`], and the [`decompose::Builder`] its
//!   decompositions are written against;
//! * simplification ([`mod@rewrite`], entry point [`simplify()`]): egg rewriting of a primitive
//!   graph (identities, constant folding, view and cast chains, matrix-product algebra), with
//!   extraction by bytes moved and flops, and a [`RewriteReport`] (`rewrites.txt`);
//! * lowering ([`mod@lower`], entry point [`lower()`]): a primitive graph becomes a
//!   [`coil_ir::loops::LoopProgram`], views folded into index expressions and pointwise
//!   producers inlined into their consumers, with buffers only where they are required;
//! * split reductions ([`split_reductions`]): a reduction with few outputs and long rows becomes
//!   two (partials in parallel, then the partials), before scheduling;
//! * scheduling ([`mod@schedule`], entry points [`schedule()`] and [`print_schedule()`]): the
//!   greedy, deterministic fusion of loop nodes into kernels ([`coil_ir::kernel::Schedule`]),
//!   every refused fusion with its reason, and the memory plan.
//!
//! * reverse-mode differentiation ([`mod@autodiff`], entry point [`autodiff::backward`]): the
//!   gradient of a primitive graph's output appended to it as more primitive nodes, one rule per
//!   primitive;
//! * dynamic shapes ([`mod@dynamic`], entry point [`dynamic::generalize`]): the passes above run
//!   at probe sizes and the sizes of the result are read back as expressions of size symbols.
//! * the attention template ([`mod@attention`], entry point [`attention::fuse_attention`]):
//!   written-out attention in a captured graph becomes one `scaled_dot_product_attention` node,
//!   which the compile path's decomposition ([`decompose_with`] with
//!   [`DecomposeOptions::fused_attention`]) keeps whole and lowering turns into one
//!   flash-attention call; its gradients ([`mod@autodiff`]) become one backward call. The
//!   chain is found by e-graph rewriting on the captured graph ([`mod@templates`]: rules as egg
//!   patterns with conditions, extraction by bytes moved, flops and launches).
//!
//! The contracts between these steps are in `docs/compiler.md`. It depends only on `coil-ir`.

#![warn(missing_docs)]

pub mod attention;
pub mod autodiff;
pub mod decompose;
pub mod dynamic;
pub mod lower;
pub mod rewrite;
pub mod schedule;
pub mod split;
pub mod templates;

pub use decompose::{decompose, decompose_for, decompose_with, DecomposeOptions};
pub use lower::{lower, lower_dynamic};
pub use rewrite::{simplify, RewriteOptions, RewriteReport};
pub use schedule::{donate, print_schedule, schedule, schedule_with, ScheduleOptions};
pub use split::split_reductions;

#[cfg(test)]
mod test_graph;
