//! Differential tests on the CPU: random programs compiled vs the reference interpreter.
//! The generator and the comparison are in `harness.rs`.

mod harness;

#[test]
fn compiled_programs_agree_with_the_interpreter() {
    harness::check_all(coil::Device::Cpu);
}

#[test]
fn dynamic_programs_agree_with_the_interpreter_at_every_size() {
    harness::check_all_dynamic(coil::Device::Cpu);
}

#[test]
fn long_row_reductions_agree_with_the_interpreter() {
    harness::check_long_rows(coil::Device::Cpu);
}

#[test]
fn wide_column_reductions_agree_with_the_interpreter() {
    harness::check_wide_columns(coil::Device::Cpu);
}

#[test]
fn long_column_reductions_agree_with_the_interpreter() {
    harness::check_long_columns(coil::Device::Cpu);
}
