//! The modules: layers ([`layers`]), convolutions ([`conv`]) and transformer pieces
//! ([`transformer`]).

pub mod conv;
pub mod layers;
pub mod transformer;
