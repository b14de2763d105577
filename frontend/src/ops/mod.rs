//! The user-facing ops, as `Tensor` methods and a few free functions. Each records one node
//! (see [`crate::Tensor`]); composite ops are decomposed later by `coil-passes`.

pub mod creation;
pub mod linalg;
pub mod movement;
pub mod nn;
pub mod overload;
pub mod pointwise;
pub mod reduce;
pub mod sampling;
pub mod shape;
pub mod sort;
