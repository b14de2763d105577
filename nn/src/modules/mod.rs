//! The modules: layers ([`layers`]) and transformer pieces ([`transformer`]).

pub mod layers;
pub mod transformer;
