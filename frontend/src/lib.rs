//! `coil-frontend`: the user-facing lazy tensor API.
//!
//! It owns:
//! * [`Tensor`]: a lazy tensor whose ops record nodes with the caller's source line;
//! * the op methods (`ops`), with PyTorch's names, semantics and errors;
//! * [`capture`] (tensors to a [`coil_ir::Graph`]) and realization (capture, decompose, run).

pub mod ops;
pub mod realize;
pub mod tensor;

pub use ops::linalg::linear;
pub use ops::nn::{embedding, scaled_dot_product_attention, CrossEntropyOptions, LossReduction};
pub use ops::pointwise::{pow, where_, IntoTensor};
pub use ops::shape::{cat, stack};
pub use realize::{capture, realize, Captured};
pub use tensor::{manual_seed, wrap_dim, Tensor};
