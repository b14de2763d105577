//! The last line of defence: a panic that escapes the compiler, the interpreter or a compiled
//! graph's run becomes an [`Error`] of kind [`ErrorKind::Internal`] naming the graph's ops and
//! the user's line, instead of unwinding through the user's program.
//!
//! Panics inside coil are bugs, fixed where they arise (the API fuzzer, `tests/fuzz`, looks for
//! them); this only keeps one from taking the user's program down with a message that names
//! nothing the user wrote.
//!
//! [`ErrorKind::Internal`]: coil_ir::ErrorKind::Internal

use coil_ir::{Error, Graph, Result};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs `f`, a step (`what`: "compiling", "running", ...) of realizing `graph`; a panic in it
/// becomes an internal error.
pub(crate) fn guard<T>(what: &str, graph: &Graph, f: impl FnOnce() -> Result<T>) -> Result<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("(no message)");
        Err(internal(what, graph, message))
    })
}

/// The error for a panic with `message` while doing `what` to `graph`: it names the graph's
/// ops, and the op and line of its first output that has one.
fn internal(what: &str, graph: &Graph, message: &str) -> Error {
    let mut ops: Vec<&str> = Vec::new();
    for node in &graph.nodes {
        let name = node.op.name();
        if !node.op.is_leaf() && !ops.contains(&name) {
            ops.push(name);
        }
    }
    let e = Error::internal(format!(
        "coil panicked while {what} a graph of {} nodes (ops: {}): {message}. This is a bug in coil",
        graph.nodes.len(),
        ops.join(", ")
    ));
    let output = graph.outputs.iter().map(|&o| graph.node(o)).find(|n| n.location.is_some());
    match output {
        Some(node) => {
            let operands = node.inputs.iter().map(|&i| graph.meta(i).to_string()).collect();
            e.in_op(node.op.name(), operands).at(node.location.expect("found with one"))
        }
        None => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use coil_ir::{DType, ErrorKind, Op, TensorMeta, UnaryOp};
    use std::panic::Location;

    #[test]
    fn a_panic_becomes_an_internal_error_naming_the_ops_and_the_line() {
        let mut g = Graph::new();
        let x = g.input(TensorMeta::new(vec![2], DType::F32));
        let here = Location::caller();
        let y = g.push(Op::Unary(UnaryOp::Exp), &[x], Some(here)).unwrap();
        g.outputs.push(y);
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {})); // keep the test's output clean
        let r: Result<()> = guard("compiling", &g, || panic!("an invariant broke"));
        std::panic::set_hook(hook);
        let e = r.unwrap_err();
        assert_eq!(e.kind, ErrorKind::Internal);
        assert_eq!(e.op.as_deref(), Some("exp"));
        assert_eq!(e.location, Some(here));
        assert!(e.message.contains("while compiling") && e.message.contains("an invariant broke"), "{e}");
        assert_eq!(guard("running", &g, || Ok(7)), Ok(7));
    }
}
