//! Ops written as compositions of other ops, in the frontend.
//!
//! Such an op records the nodes of the ops it is made of, so a failure inside it would name an
//! inner op (`mul`) and its operands. [`CompositeScope::enter`] marks the outermost composite op
//! on this thread: while it is alive, every recording error names that op, its operands and its
//! caller's line, and every node recorded gets that line (also from inside closures, where
//! `Location::caller()` would be the closure's own line).

use crate::tensor::Tensor;
use coil_ir::{Error, TensorMeta};
use std::cell::RefCell;
use std::panic::Location;

struct Scope {
    op: &'static str,
    operands: Vec<TensorMeta>,
    location: &'static Location<'static>,
}

thread_local! {
    static SCOPE: RefCell<Option<Scope>> = const { RefCell::new(None) };
}

/// While alive, errors and nodes recorded on this thread belong to one composite op; nested
/// composite ops (a `huber_loss` inside a `smooth_l1_loss`) leave the outermost in charge.
pub(crate) struct CompositeScope {
    owner: bool,
}

impl CompositeScope {
    pub(crate) fn enter(op: &'static str, srcs: &[&Tensor], location: &'static Location<'static>) -> CompositeScope {
        SCOPE.with(|s| {
            let mut s = s.borrow_mut();
            if s.is_some() {
                return CompositeScope { owner: false };
            }
            let operands = srcs.iter().map(|t| t.meta().clone()).collect();
            *s = Some(Scope { op, operands, location });
            CompositeScope { owner: true }
        })
    }
}

impl Drop for CompositeScope {
    fn drop(&mut self) {
        if self.owner {
            SCOPE.with(|s| *s.borrow_mut() = None);
        }
    }
}

/// The line of the composite op being recorded, if any.
pub(crate) fn location() -> Option<&'static Location<'static>> {
    SCOPE.with(|s| s.borrow().as_ref().map(|s| s.location))
}

/// `e` as an error of the composite op being recorded, if any: its name, operands and line.
pub(crate) fn attribute(mut e: Error) -> Error {
    SCOPE.with(|s| {
        if let Some(scope) = s.borrow().as_ref() {
            e.op = Some(scope.op.to_string());
            e.operands = scope.operands.iter().map(|m| m.to_string()).collect();
            e.location = Some(scope.location);
        }
    });
    e
}

/// A composite op's operand, on `x`'s device: a Rust scalar (a weak scalar, made on the CPU)
/// is made again there, as a primitive op places its weak scalars, so that the composite's
/// inner ops, which may turn it into an ordinary 0-d tensor (a cast), see one device.
pub(crate) fn beside(x: &Tensor, other: impl crate::IntoTensor) -> coil_ir::Result<Tensor> {
    let other = other.into_tensor();
    if other.is_weak_scalar() && other.device() != x.device() {
        other.to_device(x.device())
    } else {
        Ok(other)
    }
}

#[cfg(test)]
mod tests {
    use crate::Tensor;
    use coil_ir::{DType, Error, Result};

    fn assert_err(r: Result<Tensor>, op: &str, line: u32) -> Error {
        let e = r.expect_err("expected an error");
        assert_eq!(e.op.as_deref(), Some(op), "{e}");
        let loc = e.location.expect("a location");
        assert_eq!((loc.file(), loc.line()), (file!(), line), "{e}");
        e
    }

    #[test]
    fn errors_inside_a_composite_name_it_its_operands_and_the_callers_line() {
        let (a, b) = (Tensor::zeros(&[3, 4], DType::F32), Tensor::zeros(&[5], DType::F32));
        // The failing op inside is a `sub`: the error still names `lerp` and both operands.
        let e = assert_err(a.lerp(&b, 0.5), "lerp", line!());
        assert_eq!(e.operands[..2], ["f32[3, 4]".to_string(), "f32[5]".to_string()], "{e}");
        assert_err(a.smooth_l1_loss(&b, coil_ir::LossReduction::Mean, 1.0), "smooth_l1_loss", line!());
        assert_err(Tensor::zeros(&[4], DType::I64).leaky_relu(0.1), "leaky_relu", line!());
        assert_err(a.cosine_similarity(&b, 1, 1e-8), "cosine_similarity", line!());
        // A failing view inside (`reshape`, which renames its errors) is the composite's too.
        assert_err(Tensor::zeros(&[3], DType::F32).glu(0), "glu", line!());
        assert_err(Tensor::zeros(&[2, 5], DType::F32).pixel_shuffle(2), "pixel_shuffle", line!());
        assert_err(Tensor::zeros(&[2, 3], DType::F32).tensordot(&b, &[1], &[0]), "tensordot", line!());
        // After a composite op, plain ops name themselves again.
        assert_err(a.add(&b), "add", line!());
    }

    #[test]
    fn every_node_of_a_composite_carries_the_callers_line() {
        let (a, b) = (Tensor::ones(&[2, 3], DType::F32), Tensor::ones(&[2, 3], DType::F32));
        let (y, line) = (a.cosine_similarity(&b, 1, 1e-8).unwrap(), line!());
        let mut stack = vec![y];
        let mut seen = 0;
        while let Some(t) = stack.pop() {
            if !t.0.srcs(&crate::history::read()).is_empty() {
                let loc = t.0.location.expect("a recorded node has a line");
                assert_eq!((loc.file(), loc.line()), (file!(), line), "{:?}", t.0.op);
                seen += 1;
            }
            stack.extend(t.0.srcs(&crate::history::read()).iter().cloned());
        }
        assert!(seen > 5, "cosine_similarity should record several nodes, saw {seen}");
    }

    #[test]
    fn huge_arguments_are_errors_not_overflows() {
        let x = Tensor::ones(&[1, 4, 2, 2], DType::F32);
        assert_err(x.pixel_shuffle(usize::MAX), "pixel_shuffle", line!());
        assert_err(x.max_pool2d([2, 2], &[], [usize::MAX, 0]), "max_pool2d", line!());
        assert_err(x.unfold2d([usize::MAX, 1], [usize::MAX, 1], [usize::MAX, 0], [1, 1]), "unfold", line!());
        assert_err(x.repeat_interleave(usize::MAX, Some(1)), "repeat_interleave", line!());
        let big = Tensor::ones(&[1 << 40], DType::F32).expand(&[1 << 40]).unwrap();
        assert_err(big.kron(&big), "kron", line!());
        assert!(Tensor::tril_indices(1 << 40, 1 << 40, i64::MAX).is_err());
        assert!(Tensor::zeros(&[0], DType::F32).tensor_split(usize::MAX, 0).is_err());
    }

    #[test]
    fn out_of_range_indices_in_compositions_are_errors_when_the_graph_runs() {
        let classes = Tensor::from_vec(vec![0i64, 3], &[2]).unwrap();
        let e = classes.one_hot(3).unwrap().to_vec::<i64>().unwrap_err();
        assert!(e.to_string().contains(file!()), "{e}");
        let x = Tensor::zeros(&[2, 3], DType::F32);
        let past = Tensor::from_vec(vec![3i64], &[1]).unwrap();
        assert!(x.index_fill(1, &past, 0.0).unwrap().to_vec::<f32>().is_err());
        assert!(x.take(&past.mul(2).unwrap()).unwrap().to_vec::<f32>().is_err());
        let target = Tensor::from_vec(vec![0i64, 5], &[2]).unwrap();
        let nll = x.nll_loss(&target, Default::default()).unwrap();
        assert!(nll.to_vec::<f32>().is_err());
    }

    #[test]
    fn fmod_from_remainder_is_exact() {
        // Pairs over a wide range of magnitudes, signs and ratios; Rust's `%` on floats is C's fmod.
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let value = |next: &mut dyn FnMut() -> u64| {
            let r = next();
            let mantissa = (r & 0xffff) as f32 / 65536.0 + 0.5;
            let exponent = ((r >> 16) % 80) as i32 - 40;
            let sign = if (r >> 32) & 1 == 1 { -1.0 } else { 1.0 };
            sign * mantissa * 2f32.powi(exponent)
        };
        let (a, b): (Vec<f32>, Vec<f32>) = (0..4096).map(|_| (value(&mut next), value(&mut next))).unzip();
        for backend in [crate::Backend::Interpreter, crate::Backend::Compiled] {
            crate::set_backend(backend);
            let got = Tensor::from_vec(a.clone(), &[4096])
                .unwrap()
                .fmod(Tensor::from_vec(b.clone(), &[4096]).unwrap())
                .unwrap()
                .to_vec::<f32>()
                .unwrap();
            for i in 0..a.len() {
                let want = a[i] % b[i];
                assert_eq!(
                    got[i].to_bits(),
                    want.to_bits(),
                    "{backend:?}: fmod({}, {}) = {} but C gives {want}",
                    a[i],
                    b[i],
                    got[i]
                );
            }
        }
    }
}
