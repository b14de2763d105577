//! Whole models written with the modules of this crate, with Hugging Face's parameter names.

pub mod gpt2;
pub mod llama;
