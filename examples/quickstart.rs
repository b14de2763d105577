//! Quickstart: build `softmax(x @ w + b)` lazily, show the captured graph, the primitive graph it
//! decomposes to, and the values.
//!
//! Run with `cargo run --release --example quickstart`.

use coil::{DType, Tensor};

fn main() -> coil::Result<()> {
    coil::manual_seed(0);
    let x = Tensor::randn(&[4, 8], DType::F32)?;
    let w = Tensor::randn(&[8, 3], DType::F32)?;
    let b = Tensor::from_vec(vec![0.1f32, -0.2, 0.3], &[3])?;

    // Nothing runs yet: each op records a node with this file's line.
    let y = (x.matmul(&w)? + &b).softmax(-1)?;

    let captured = coil::capture(&[&y]).graph;
    println!("== captured graph ==\n{}", captured.print(true));
    let primitive = coil::decompose(&captured)?;
    println!("== decomposed into primitives ==\n{}", primitive.print(true));

    // Asking for the values runs the graph.
    println!("== result on {} ==\n{y}", coil::Device::default());
    let rows: Vec<f32> = y.sum(&[-1], false)?.to_vec()?;
    println!("row sums: {rows:?}");

    // Errors name the op, the shapes and this line.
    let bad = Tensor::ones(&[5, 3], DType::F32);
    if let Err(e) = x.matmul(&bad) {
        println!("\nan error, as users see it:\n{e}");
    }
    Ok(())
}
