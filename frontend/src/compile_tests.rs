//! The compile cache's key: the settings of the configuration that change code are part of it.

use super::*;
use crate::walk::Walk;
use crate::Tensor;
use coil_ir::config::{with_config, Tuning};

/// A graph no other test compiles (its own sizes), and the tensor it computes.
fn softmax_of(rows: usize, cols: usize) -> Tensor {
    let x = Tensor::from_vec((0..rows * cols).map(|i| (i % 7) as f32 * 0.25).collect(), &[rows, cols]).unwrap();
    x.softmax(-1).unwrap()
}

/// The current configuration with `change` applied.
fn changed(change: impl FnOnce(&mut Config)) -> Config {
    let mut config = (*coil_ir::config::current()).clone();
    change(&mut config);
    config
}

#[test]
fn settings_that_change_code_miss_the_cache_and_others_hit() {
    if coil_runtime::testing::c_compiler().is_none() {
        return;
    }
    let graph = crate::capture(&[&softmax_of(3, 37)]).graph;
    let first = compile(&graph, Device::Cpu).unwrap();
    let logs = changed(|c| {
        c.logs = vec!["guards".into()];
        c.debug_dir = None;
    });
    let with_logs = with_config(logs, || compile(&graph, Device::Cpu)).unwrap();
    assert!(Arc::ptr_eq(&first, &with_logs), "the logs do not change code: a hit");

    let no_rewrite = with_config(changed(|c| c.rewrite = !c.rewrite), || compile(&graph, Device::Cpu)).unwrap();
    assert!(!Arc::ptr_eq(&first, &no_rewrite), "rewriting on/off changes code: a miss");
    let tuning = changed(|c| c.tuning = Tuning { row_unroll: Some(2), ..c.tuning.clone() });
    let tuned = with_config(tuning, || compile(&graph, Device::Cpu)).unwrap();
    assert!(!Arc::ptr_eq(&first, &tuned) && !Arc::ptr_eq(&no_rewrite, &tuned));

    // Back under the first configuration: its compilation again.
    assert!(Arc::ptr_eq(&first, &compile(&graph, Device::Cpu).unwrap()));
}

#[test]
fn realizations_recompile_under_a_setting_that_changes_code() {
    if coil_runtime::testing::c_compiler().is_none() {
        return;
    }
    let y = softmax_of(5, 41);
    let outputs = [&y];
    let walk = Walk::new(&outputs, &[]);
    let (first, _) = compiled_walk(&walk, &[]).unwrap();
    let (again, _) = compiled_walk(&walk, &[]).unwrap();
    assert!(Arc::ptr_eq(&first, &again), "the same graph realized again: a hit");
    let autotune = changed(|c| c.autotune = !c.autotune);
    let (other, _) = with_config(autotune, || compiled_walk(&walk, &[])).unwrap();
    assert!(!Arc::ptr_eq(&first, &other), "autotuning changes what runs: a miss");
    let profile = changed(|c| c.profile = !c.profile);
    let (profiled, _) = with_config(profile, || compiled_walk(&walk, &[])).unwrap();
    assert!(Arc::ptr_eq(&first, &profiled), "profiling does not change code: a hit");
}

#[test]
fn rewrites_are_costed_for_the_device_compiled_for() {
    // The CPU's cost model on the CPU (a GPU's comes from its `GpuTarget`, read from the device).
    let cpu = rewrite_options(Device::Cpu).unwrap();
    assert_eq!(cpu.model, coil_passes::rewrite::CostModel::cpu());
    assert_ne!(cpu.model, coil_passes::RewriteOptions::default().model, "the default is the H100's");
}
