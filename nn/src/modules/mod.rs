//! The modules: layers ([`layers`]), convolutions ([`conv`]), batch normalization ([`norm`])
//! and transformer pieces ([`transformer`]).

pub mod conv;
pub mod layers;
pub mod norm;
pub mod transformer;
