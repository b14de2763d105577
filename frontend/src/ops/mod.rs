//! The user-facing ops, as `Tensor` methods and a few free functions. Each records one node
//! (see [`crate::Tensor`]); composite ops are decomposed later by `coil-passes`.

pub mod activation;
pub mod assemble;
pub(crate) mod composite;
pub mod conv;
pub mod creation;
pub mod data_dependent;
pub mod einsum;
pub mod im2col;
pub mod index_put;
pub mod indexing;
pub mod linalg;
pub mod loss;
pub mod math;
pub mod movement;
pub mod mutation;
pub mod nn;
pub mod overload;
pub mod pointwise;
pub mod pooling;
pub mod products;
pub mod random;
pub mod reduce;
pub mod registry;
pub mod sampling;
pub mod scans;
pub mod scatter;
pub mod shape;
pub mod sort;
pub mod stats;
pub mod vision;
