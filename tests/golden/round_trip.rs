//! Every golden case's graphs round-trip through the graph text (`coil::Graph::parse`), and
//! the loop programs, schedules and tile kernels lowered from them through theirs
//! (`LoopProgram::parse`, `Schedule::parse`, `TileKernel::parse`).

use crate::harness::{for_each_case, run_case};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Every case's graph, captured, decomposed (as the interpreter and as the compile path
/// decompose: templates kept whole) and simplified, prints as text that [`coil::Graph::parse`]
/// reads back to the same graph (up to source locations and decomposition origins, which the
/// text does not carry) and that prints the same again.
pub fn check_text_round_trips() {
    use coil_passes::DecomposeOptions;
    let compile_options =
        DecomposeOptions { fused_attention: true, half_products: true, conv_template: true, ..Default::default() };
    let (mut graphs, mut programs, mut kernels, mut failures) = (0, 0, 0, Vec::new());
    for_each_case(coil::Device::Cpu, |name, _, _, inputs, _| {
        let Ok(Some(Ok(outs))) = catch_unwind(AssertUnwindSafe(|| run_case(name, &inputs))) else { return };
        let captured = coil::capture(&outs.iter().collect::<Vec<_>>()).graph;
        let mut stages = vec![("captured", captured.clone())];
        for (stage, options) in
            [("decomposed", DecomposeOptions::default()), ("decomposed for compiling", compile_options)]
        {
            let Ok(primitive) = coil_passes::decompose_with(&captured, &options) else { continue };
            if let Ok((simplified, _)) = coil_passes::simplify(&primitive, &Default::default()) {
                stages.push(("simplified", simplified));
            }
            stages.push((stage, primitive));
        }
        for (stage, graph) in &stages {
            graphs += 1;
            if let Err(e) = round_trip(graph) {
                failures.push(format!("{name} ({stage}): {e}"));
            }
        }
        // The compile path's program: the last simplified graph, lowered, split, scheduled.
        let Some((_, graph)) = stages.iter().rev().find(|(stage, _)| *stage == "simplified") else { return };
        let Ok(lowered) = coil_passes::lower(graph) else { return };
        for program in [coil_passes::split_reductions(&lowered), lowered] {
            programs += 1;
            if let Err(e) = text_round_trip(&program, coil_ir::loops::LoopProgram::parse) {
                failures.push(format!("{name} (loop program): {e}"));
            }
            let schedule = coil_passes::schedule(&program);
            if let Err(e) = text_round_trip(&schedule, coil_ir::kernel::Schedule::parse) {
                failures.push(format!("{name} (schedule): {e}"));
            }
            for k in schedule.kernels.iter().filter(|k| k.kind != coil_ir::kernel::KernelKind::Extern) {
                kernels += 1;
                let tile = coil_codegen::build_kernel(&program, k);
                if let Err(e) = text_round_trip(&tile, coil_ir::kernel::TileKernel::parse) {
                    failures.push(format!("{name} (tile kernel {}): {e}", k.name));
                }
            }
        }
    });
    println!("{graphs} graphs, {programs} loop programs (and their schedules) and {kernels} tile kernels round-trip through text");
    assert!(graphs >= 600 && programs >= 300 && kernels >= 300, "only {graphs} / {programs} / {kernels} checked");
    assert!(failures.is_empty(), "{} do not round-trip:\n{}", failures.len(), failures.join("\n"));
}

/// `ir` printed, parsed and printed again: the same text, and the same IR.
fn text_round_trip<T: PartialEq + std::fmt::Display + std::fmt::Debug>(
    ir: &T,
    parse: fn(&str) -> coil::Result<T>,
) -> Result<(), String> {
    let text = ir.to_string();
    let parsed = catch_unwind(AssertUnwindSafe(|| parse(&text)))
        .map_err(|_| format!("the parser panics on\n{text}"))?
        .map_err(|e| format!("{e}\n{text}"))?;
    if parsed != *ir {
        return Err(format!("parses as another value:\n{parsed:?}\nwas\n{ir:?}\ntext:\n{text}"));
    }
    let again = parsed.to_string();
    if again != text {
        return Err(format!("prints differently:\n{again}\nwas\n{text}"));
    }
    Ok(())
}

/// `graph` printed, parsed and printed again: the same text, and the same graph.
fn round_trip(graph: &coil::Graph) -> Result<(), String> {
    let text = graph.to_string();
    let parsed = coil::Graph::parse(&text).map_err(|e| format!("{e}\n{text}"))?;
    let mut want = graph.clone();
    for node in &mut want.nodes {
        (node.location, node.origin) = (None, None);
    }
    if let Some(i) = (0..want.nodes.len()).find(|&i| parsed.nodes.get(i) != Some(&want.nodes[i])) {
        return Err(format!("node %{i} parses as {:?}, was {:?}", parsed.nodes.get(i), want.nodes[i]));
    }
    if (&parsed.nodes.len(), &parsed.inputs, &parsed.outputs) != (&want.nodes.len(), &want.inputs, &want.outputs) {
        return Err(format!("inputs or outputs differ:\n{text}"));
    }
    let again = parsed.to_string();
    if again != text {
        return Err(format!("prints differently:\n{again}\nwas\n{text}"));
    }
    Ok(())
}
