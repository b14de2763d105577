//! Every golden case's graphs round-trip through the graph text (`coil::Graph::parse`).

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
    let (mut graphs, mut failures) = (0, Vec::new());
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
        for (stage, graph) in stages {
            graphs += 1;
            if let Err(e) = round_trip(&graph) {
                failures.push(format!("{name} ({stage}): {e}"));
            }
        }
    });
    println!("{graphs} graphs round-trip through text");
    assert!(graphs >= 600, "only {graphs} graphs checked");
    assert!(failures.is_empty(), "{} graphs do not round-trip:\n{}", failures.len(), failures.join("\n"));
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
