//! Quickstart: a small model, `softmax(gelu(x @ w1 + b1) @ w2 + b2)`, built lazily, compiled and
//! run on the default device (a CUDA GPU when one is usable, else the CPU).
//!
//! It prints the captured graph (with this file's lines), the primitive graph it decomposes to,
//! the kernels the compiler made, and the result.
//!
//! Run with `cargo run --release --example quickstart` (`COIL_DEBUG=1` also writes every stage
//! to `./coil_debug/`).

use coil::{DType, Device, Tensor};

fn main() -> coil::Result<()> {
    let device = Device::default();
    coil::set_default_device(device);
    coil::manual_seed(0);

    // Data and weights (random normal), on the default device, computed now: in a real program
    // they are loaded, not part of the model's graph.
    let x = Tensor::randn(&[4, 8], DType::F32)?;
    let w1 = Tensor::randn(&[8, 16], DType::F32)? * 0.3;
    let b1 = Tensor::from_vec(vec![0.1f32; 16], &[16])?.to_device(device)?;
    let w2 = Tensor::randn(&[16, 3], DType::F32)? * 0.3;
    let b2 = Tensor::from_vec(vec![0.1f32, -0.2, 0.3], &[3])?.to_device(device)?;
    coil::realize(&[&x, &w1, &w2])?;

    // Nothing runs yet: each op records a node with this file's line.
    let h = (x.matmul(&w1)? + &b1).gelu(true)?;
    let y = (h.matmul(&w2)? + &b2).softmax(-1)?;

    let captured = coil::capture(&[&y]).graph;
    println!("== captured graph ==\n{}", captured.print(true));
    println!("== decomposed into primitives ==\n{}", coil::decompose(&captured)?.print(true));

    // What the compiler makes of it: fused kernels and library calls, in launch order.
    if coil::backend() == coil::Backend::Compiled {
        let compiled = coil::inspect(&[&y])?;
        println!("== kernels on {device} ==\n{}", compiled.post_fusion);
        if let Some(first) = compiled.kernels.iter().flatten().next() {
            println!("== the first generated kernel, as a block program ==\n{first}");
        }
    }

    // Asking for the values runs the graph.
    println!("== result on {device} ==\n{y}");
    let rows: Vec<f32> = y.sum(&[-1], false)?.to_vec()?;
    println!("row sums: {rows:?}");

    // Errors name the op, the shapes and this line.
    let bad = Tensor::ones(&[5, 3], DType::F32);
    if let Err(e) = x.matmul(&bad) {
        println!("\nan error, as users see it:\n{e}");
    }
    Ok(())
}
