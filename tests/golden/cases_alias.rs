//! Golden cases: in-place ops on views and their bases (PyTorch's aliasing). Each program runs
//! eagerly and inside a compiled function; both must give PyTorch's values (the compiled
//! function's are compared with PyTorch, the eager ones with the compiled function's).
use super::{Inputs, Outputs};
use coil::*;

type Program = fn(Tensor, &Tensor) -> Result<Vec<Tensor>>;

pub fn run(name: &str, i: &Inputs) -> Option<Outputs> {
    let program: Program = match name {
        "alias_narrow_sees_base_add" => |mut x, b| {
            let v = x.narrow(0, 1, 2)?;
            x.add_(b)?;
            Ok(vec![x, v])
        },
        "alias_select_mul_writes_base" => |x, b| {
            let c = x.select(1, 2)?;
            x.select(0, 1)?.mul_(b)?;
            Ok(vec![x, c])
        },
        "alias_view_chain_copy" => |x, b| {
            let mut v = x.t()?.narrow(0, 1, 3)?.select(1, 2)?;
            v.copy_(b)?;
            Ok(vec![x, v])
        },
        "alias_reshape_view_zero" => |x, _| {
            x.reshape(&[20])?.slice(0, Some(3), Some(17), 4)?.zero_()?;
            Ok(vec![x])
        },
        "alias_reshape_copy_keeps_old" => |mut x, _| {
            let y = x.t()?.reshape(&[20])?;
            x.mul_(2.0)?;
            Ok(vec![x, y])
        },
        "alias_diagonal_fill" => |x, _| {
            let d = x.diagonal(0, 0, 1)?;
            x.diagonal(0, 0, 1)?.fill_(7.0)?;
            Ok(vec![x, d])
        },
        "alias_detach_add" => |x, b| {
            let mut d = x.detach()?;
            d.add_(b)?;
            Ok(vec![x, d])
        },
        "alias_read_before_write" => |x, b| {
            let s = x.sum(&[0], false)?;
            x.slice(0, Some(1), None, 1)?.sub_(b)?;
            Ok(vec![x, s])
        },
        _ => return None,
    };
    Some(both(program, &i["a"], i.0.get("b")))
}

/// A copy of an input's elements: the program writes over it, the input stays as it is.
fn copy(t: &Tensor) -> Result<Tensor> {
    Ok(Tensor::from_buffer((*t.buffer()?).clone()))
}

fn both(program: Program, a: &Tensor, b: Option<&Tensor>) -> Result<Vec<Tensor>> {
    let b = b.cloned().unwrap_or_else(|| Tensor::scalar(0.0f32));
    let eager = program(copy(a)?, &copy(&b)?)?;
    let f = compile(move |args: &[Tensor]| program(args[0].clone(), &args[1]));
    let compiled = f.call(&[&copy(a)?, &copy(&b)?])?;
    for (k, (e, c)) in eager.iter().zip(&compiled).enumerate() {
        let (e, c) = (e.to_vec::<f64>()?, c.to_vec::<f64>()?);
        if e.iter().zip(&c).any(|(x, y)| (x - y).abs() > 1e-6 * (1.0 + y.abs())) {
            return Err(Error::value(format!("output {k}: eager {e:?} but compiled {c:?}")));
        }
    }
    Ok(compiled)
}
