//! A graph's translation units as the disk cache holds them ([`CachedUnit`]), and loading them
//! again by their CUBINs' keys, without their sources (the frontend's graph cache).

use super::compiler::{self, CompiledCubin, LoadedModule};
use super::CudaDevice;
use coil_codegen::cuda::{CudaKernel, Language};
use std::path::Path;
use std::sync::Arc;

/// One translation unit of a compiled graph as the disk cache holds it: enough to load its
/// CUBIN and launch its kernels without emitting its source again.
#[derive(Clone, Debug, PartialEq)]
pub struct CachedUnit {
    /// The language its source was in (NVRTC's CUDA C, or PTX at an assembler level).
    pub language: Language,
    /// The cache key of its CUBIN (`<cache dir>/cuda/<key>.cubin.entry`).
    pub key: String,
    /// Its kernels, by their names in the schedule, with their launches.
    pub kernels: Vec<CudaKernel>,
    /// Each kernel's symbol in the CUBIN, in the order of `kernels` (a one-kernel unit is
    /// compiled under a canonical name, so that identical kernels share one CUBIN).
    pub symbols: Vec<String>,
}

/// The translation units of a graph, built or loaded.
pub(super) struct Built {
    /// The units with kernels.
    pub units: Vec<CachedUnit>,
    /// The index in `loaded` of each unit's module (units of identical code share one).
    pub unit_of: Vec<usize>,
    /// The distinct loaded CUBINs.
    pub loaded: Vec<Arc<LoadedModule>>,
    /// Where each of `loaded` came from.
    pub cubins: Vec<CompiledCubin>,
    /// Wall-clock seconds of the compiles (0 when every CUBIN was cached).
    pub compile_seconds: f64,
}

/// `units` loaded from `cache_dir` by their keys (each distinct key once, with every symbol
/// its units launch checked present); `None` when one is missing, damaged or refused by the
/// driver.
pub(super) fn load_cached(device: &Arc<CudaDevice>, units: &[CachedUnit], cache_dir: &Path) -> Option<Built> {
    let mut distinct: Vec<&CachedUnit> = Vec::new();
    let unit_of: Vec<usize> = (units.iter())
        .map(|u| match distinct.iter().position(|d| d.key == u.key) {
            Some(i) => i,
            None => {
                distinct.push(u);
                distinct.len() - 1
            }
        })
        .collect();
    // In parallel, as a compile loads its units (each load binds the context on its thread).
    use rayon::prelude::*;
    let load = |(i, unit): (usize, &&CachedUnit)| {
        let mut names: Vec<&str> = Vec::new();
        for (u, _) in units.iter().zip(&unit_of).filter(|(_, &d)| d == i) {
            names.extend(u.symbols.iter().map(String::as_str));
        }
        names.sort_unstable();
        names.dedup();
        compiler::load_cached(device, &unit.key, unit.language, &names, cache_dir)
    };
    let found: Vec<_> = distinct.par_iter().enumerate().map(load).collect();
    let (loaded, cubins) = found.into_iter().collect::<Option<Vec<_>>>()?.into_iter().unzip();
    Some(Built { units: units.to_vec(), unit_of, loaded, cubins, compile_seconds: 0.0 })
}
