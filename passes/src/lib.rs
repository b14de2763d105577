//! `coil-passes`: graph-to-graph passes: decomposition to primitives (now); e-graph
//! simplification, lowering to loop IR, fusion and memory planning (later).
//!
//! It owns:
//! * the decomposition table ([`mod@decompose`], entry point [`decompose()`]), which turns a
//!   captured graph (composite ops such as softmax, layer_norm, gelu, cross_entropy, linear and
//!   attention; Rust scalars; implicit broadcasting and type promotion) into a primitive graph
//!   that satisfies [`coil_ir::Graph::verify_primitive`], and the [`decompose::Builder`] its
//!   decompositions are written against.
//!
//! It depends only on `coil-ir`.

pub mod decompose;

pub use decompose::decompose;
