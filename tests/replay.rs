//! Decode loops through a replayed compiled function (`CompiledFn::replay`: the step's body runs
//! for its first two calls only, the key/value cache captured and written in place) give the
//! tokens, logits and cache of plain loops, greedy and sampled on the device. `tests/gpu.rs`
//! runs the same cases on CUDA.

#[path = "replay/cases.rs"]
mod cases;

use coil::{Device, Sampling};

#[test]
fn replayed_greedy_decode_steps_match_plain_ones() {
    for name in cases::MODELS {
        cases::check_replayed_decode(name, Device::Cpu, &Sampling::greedy(), false);
    }
}

#[test]
fn replayed_sampling_decode_steps_draw_the_plain_loops_numbers() {
    let sampling = Sampling { temperature: 0.8, top_k: Some(5), top_p: None };
    for name in cases::MODELS {
        cases::check_replayed_decode(name, Device::Cpu, &sampling, false);
    }
}
