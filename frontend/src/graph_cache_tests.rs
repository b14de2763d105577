//! The graph cache: a second compile in a fresh process state is a hit that runs bit for bit as
//! the miss did; damaged entries are reported and rebuilt; settings that change code miss.

use super::*;
use crate::compile::{compile_uncached, Compiled, Executable};
use crate::storage::Storage;
use crate::{capture, Captured, Tensor};
use coil_ir::config::{with_config, Tuning};
use coil_ir::DType;
use std::sync::Arc;

/// A fresh cache directory, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("coil-graph-cache-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Scratch(dir)
    }

    /// The current configuration, caching in this directory, without dumps.
    fn config(&self) -> Config {
        Config {
            cache_dir: self.0.clone(),
            debug_dir: None,
            graph_cache: true,
            ..(*coil_ir::config::current()).clone()
        }
    }

    /// The graph entries in the directory.
    fn entries(&self) -> Vec<PathBuf> {
        let Ok(dir) = std::fs::read_dir(self.0.join("graphs")) else { return vec![] };
        dir.flatten().map(|e| e.path()).filter(|p| p.to_string_lossy().ends_with(".graph.entry")).collect()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Reproducible values in [-2, 2) (never all zeros).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e3779b97f4a7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
        })
        .collect()
}

fn tensor(shape: &[usize], seed: u64) -> Tensor {
    Tensor::from_vec(values(shape.iter().product(), seed), shape).unwrap()
}

/// A compile of `c` that skips this process's cache of compiled graphs (as another process
/// would compile it), with its graph-cache use.
fn compile(c: &Captured, dynamic: Option<&DynamicSpec>, donations: &[Donation]) -> Compiled {
    compile_uncached(&c.graph, c.device, dynamic, donations).unwrap()
}

/// The bytes of each output of `compiled` run on `c`'s inputs (fresh copies: a donated input
/// is written over) and random streams.
fn run(compiled: &Compiled, c: &Captured) -> Vec<Vec<u8>> {
    let inputs: Vec<Storage> =
        c.inputs.iter().map(|s| Storage::host(Arc::new((*s.to_host().unwrap()).clone()))).collect();
    let outputs = compiled.run(&inputs, &c.random).unwrap();
    outputs.iter().map(|o| o.to_host().unwrap().data.to_bytes()).collect()
}

/// A miss, then a hit that runs as the miss did (on `c` and on each of `others`, captures of the
/// same program at other sizes for a dynamic compile); returns the hit.
fn miss_then_hit(
    c: &Captured,
    dynamic: Option<&DynamicSpec>,
    donations: &[Donation],
    others: &[&Captured],
) -> Compiled {
    let miss = compile(c, dynamic, donations);
    assert_eq!(miss.times.graph_cache, GraphCacheUse::Miss);
    let hit = compile(c, dynamic, donations);
    assert_eq!(hit.times.graph_cache, GraphCacheUse::Hit, "{}", hit.summary);
    assert_eq!((hit.times.decompose, hit.times.schedule, hit.times.codegen, hit.times.cc), (0.0, 0.0, 0.0, 0.0));
    assert!(hit.summary.contains("\"graph_cache\": \"hit\""));
    assert_eq!((&hit.pre_fusion, &hit.post_fusion), (&miss.pre_fusion, &miss.post_fusion));
    assert_eq!(hit.kernels, miss.kernels);
    for case in std::iter::once(c).chain(others.iter().copied()) {
        let expected = run(&miss, case);
        assert!(expected.iter().any(|o| o.iter().any(|&b| b != 0)), "outputs of zeros prove nothing");
        assert_eq!(run(&hit, case), expected, "the hit runs as the miss did");
    }
    hit
}

fn has_c_compiler() -> bool {
    coil_runtime::testing::c_compiler().is_some()
}

#[test]
fn a_second_compile_is_a_hit_that_runs_as_the_first() {
    if !has_c_compiler() {
        return;
    }
    let dir = Scratch::new("hit");
    with_config(dir.config(), || {
        // reductions, a matrix product (extern), pointwise
        let (x, w) = (tensor(&[6, 37], 1), tensor(&[37, 5], 2));
        let y = x.matmul(&w).unwrap().softmax(-1).unwrap();
        let z = x.sum(&[1], true).unwrap().exp().unwrap();
        let hit = miss_then_hit(&capture(&[&y, &z]), None, &[], &[]);
        assert!(hit.kernels.iter().any(Option::is_none) && hit.kernels.iter().any(Option::is_some));
        assert_eq!(dir.entries().len(), 1);

        // a data check: an index read from data
        let table = tensor(&[10, 4], 3);
        let index = Tensor::from_vec(vec![3i64, 0, 9, 9, 1], &[5]).unwrap();
        let rows = table.index_select(0, &index).unwrap().mul(tensor(&[5, 4], 4)).unwrap();
        let c = capture(&[&rows]);
        let hit = miss_then_hit(&c, None, &[], &[]);
        let Executable::Cpu(g) = &hit.executable else { panic!() };
        assert!(!g.program().data_checks.is_empty(), "the program checks its indices");

        // random numbers: the hit draws what the miss drew from the same streams
        let noisy = tensor(&[64, 9], 5).dropout(0.5, true).unwrap().add(Tensor::rand(&[64, 9], DType::F32).unwrap());
        let c = capture(&[&noisy.unwrap()]);
        assert!(!c.random.is_empty());
        miss_then_hit(&c, None, &[], &[]);
    });
}

#[test]
fn donations_and_dynamic_sizes_hit_too() {
    if !has_c_compiler() {
        return;
    }
    let dir = Scratch::new("donate");
    with_config(dir.config(), || {
        // an output written over its input's buffer
        let x = tensor(&[8, 16], 6);
        let y = x.mul(2.0f32).unwrap().add(1.0f32).unwrap().softmax(-1).unwrap();
        let c = capture(&[&y]);
        let donation = Donation { output: 0, input: 0 };
        let hit = miss_then_hit(&c, None, &[donation], &[]);
        let Executable::Cpu(g) = &hit.executable else { panic!() };
        assert_eq!(g.schedule().memory.donated, [donation]);
        assert_eq!(dir.entries().len(), 1);
        // without the donation: another entry
        let plain = compile(&c, None, &[]);
        assert_eq!(plain.times.graph_cache, GraphCacheUse::Miss);

        // symbolic rows: one compile serves other sizes, hit or miss
        let program = |rows: usize, seed: u64| {
            let x = tensor(&[rows, 23], seed);
            let y = x.softmax(-1).unwrap().sum(&[0], false).unwrap();
            capture(&[&y])
        };
        let c = program(6, 7);
        let spec = crate::dynamo::dynamic::resolve(&c.graph, &[(0, 0)]).unwrap();
        let hit = miss_then_hit(&c, Some(&spec), &[], &[&program(11, 8), &program(3, 9)]);
        let Executable::Cpu(g) = &hit.executable else { panic!() };
        assert!(!g.program().symbols.is_empty());
        // the same graph at static sizes is another entry
        assert_eq!(compile(&c, None, &[]).times.graph_cache, GraphCacheUse::Miss);
    });
}

#[test]
fn damaged_entries_are_reported_and_rebuilt() {
    if !has_c_compiler() {
        return;
    }
    let dir = Scratch::new("damaged");
    with_config(dir.config(), || {
        let x = tensor(&[5, 19], 10);
        let c = capture(&[&x.softmax(-1).unwrap().mul(&x).unwrap()]);
        let first = compile(&c, None, &[]);
        let expected = run(&first, &c);
        let [path] = dir.entries().try_into().unwrap();
        let good = std::fs::read(&path).unwrap();
        let header = good.iter().position(|&b| b == b'\n').unwrap() + 1;
        let rebuilt = |damage: &dyn Fn(&mut Vec<u8>), why: &str| {
            let mut bytes = good.clone();
            damage(&mut bytes);
            std::fs::write(&path, &bytes).unwrap();
            let again = compile(&c, None, &[]);
            match &again.times.graph_cache {
                GraphCacheUse::Rebuilt(reason) => assert!(reason.contains(why), "{reason}"),
                other => panic!("expected a rebuild ({why}), got {other:?}"),
            }
            assert_eq!(run(&again, &c), expected);
            // the rebuild wrote a whole entry again
            assert_eq!(compile(&c, None, &[]).times.graph_cache, GraphCacheUse::Hit);
        };
        rebuilt(&|b| b.truncate(b.len() / 2), "payload bytes");
        rebuilt(&|b| b[header + 100] ^= 0x20, "checksum mismatch");
        rebuilt(&|b| b.clear(), "empty");
        // a whole entry of this key whose text does not parse
        let slot = slot(&c.graph, c.device, None, &[], &coil_ir::config::current()).unwrap().unwrap();
        assert_eq!(slot.path, path);
        let unparsable = |b: &mut Vec<u8>| {
            let mut payload = b[header..].to_vec();
            let at = String::from_utf8_lossy(&payload).find("outputs:").unwrap();
            payload[at..at + 8].copy_from_slice(b"outptus:");
            let dir = std::env::temp_dir().join(format!("coil-graph-cache-rewrite-{}", std::process::id()));
            let p = cache_entry::path(&dir, &slot.key, Kind::Graph);
            cache_entry::write(&p, Kind::Graph, &slot.key, &payload).unwrap();
            *b = std::fs::read(&p).unwrap();
            let _ = std::fs::remove_dir_all(&dir);
        };
        rebuilt(&unparsable, "loop text");
        // another key's entry under this name
        rebuilt(&|b| b[header - 30] = if b[header - 30] == b'0' { b'1' } else { b'0' }, "");
        // the kernels' binaries gone: a miss that compiles them again
        std::fs::remove_dir_all(dir.0.join("c")).unwrap();
        let again = compile(&c, None, &[]);
        assert!(matches!(&again.times.graph_cache, GraphCacheUse::Rebuilt(why) if why.contains("binaries")));
        assert_eq!(run(&again, &c), expected);
        assert_eq!(compile(&c, None, &[]).times.graph_cache, GraphCacheUse::Hit);
    });
}

#[test]
fn the_key_changes_with_every_setting_that_changes_code_and_no_other() {
    if !has_c_compiler() {
        return;
    }
    let dir = Scratch::new("key");
    let base = dir.config();
    let c = capture(&[&tensor(&[4, 9], 11).exp().unwrap()]);
    let key = |config: &Config| slot(&c.graph, Device::Cpu, None, &[], config).unwrap().map(|s| s.key);
    let k0 = key(&base).unwrap();
    // the compiler's build: a hash of its sources (`build.rs`), and how many files it read
    let (hash, files) = BUILD_ID.split_once('-').unwrap();
    assert!(hash.len() == 16 && files.parse::<usize>().unwrap() > 100, "{BUILD_ID}");
    assert!(key_parts(&c.graph, "cpu", None, &[], &base).contains(&BUILD_ID.to_string()));
    assert_eq!(key(&Config { graph_cache: false, ..base.clone() }), None, "off: no entry");
    let same = [
        Config { logs: vec!["all".into()], ..base.clone() },
        Config { debug_dir: Some("dumps".into()), profile: true, cuda_graphs: true, ..base.clone() },
        Config { cache_dir: "/elsewhere".into(), ..base.clone() },
    ];
    for config in &same {
        assert!(base.same_code(config));
        assert_eq!(key(config).unwrap(), k0, "{config:?}");
    }
    let t = || base.tuning.clone();
    let changed = [
        Config { rewrite: !base.rewrite, ..base.clone() },
        Config { autotune: !base.autotune, ..base.clone() },
        Config { cudnn_api: coil_ir::config::CudnnApi::Legacy, ..base.clone() },
        Config { tuning: Tuning { row_unroll: Some(2), ..t() }, ..base.clone() },
        Config { tuning: Tuning { online_softmax: !t().online_softmax, ..t() }, ..base.clone() },
        Config { tuning: Tuning { nvrtc_options: vec!["-lineinfo".into()], ..t() }, ..base.clone() },
    ];
    for config in &changed {
        assert!(!base.same_code(config));
        assert_ne!(key(config).unwrap(), k0, "{config:?}");
    }
    // the graph, its donations and its sizes are part of it too
    let other = capture(&[&tensor(&[4, 9], 11).exp().unwrap().neg().unwrap()]);
    assert_ne!(slot(&other.graph, Device::Cpu, None, &[], &base).unwrap().unwrap().key, k0);
    let donated = [Donation { output: 0, input: 0 }];
    assert_ne!(slot(&c.graph, Device::Cpu, None, &donated, &base).unwrap().unwrap().key, k0);
    let spec = crate::dynamo::dynamic::resolve(&c.graph, &[(0, 0)]).unwrap();
    assert_ne!(slot(&c.graph, Device::Cpu, Some(&spec), &[], &base).unwrap().unwrap().key, k0);
}

#[test]
fn a_config_change_that_changes_code_misses_and_the_cache_can_be_turned_off() {
    if !has_c_compiler() {
        return;
    }
    let dir = Scratch::new("config");
    let c = capture(&[&tensor(&[7, 13], 12).softmax(-1).unwrap()]);
    let base = dir.config();
    with_config(base.clone(), || assert_eq!(compile(&c, None, &[]).times.graph_cache, GraphCacheUse::Miss));
    with_config(base.clone(), || assert_eq!(compile(&c, None, &[]).times.graph_cache, GraphCacheUse::Hit));
    let tuned = Config {
        tuning: Tuning { online_softmax: !base.tuning.online_softmax, ..base.tuning.clone() },
        ..base.clone()
    };
    with_config(tuned, || assert_eq!(compile(&c, None, &[]).times.graph_cache, GraphCacheUse::Miss));
    let off = Config { graph_cache: false, ..base.clone() };
    with_config(off, || {
        let compiled = compile(&c, None, &[]);
        assert_eq!(compiled.times.graph_cache, GraphCacheUse::Off);
        assert!(compiled.summary.contains("\"graph_cache\": \"off\""));
    });
    assert_eq!(dir.entries().len(), 2);
}

#[test]
fn a_hit_still_writes_its_dump() {
    if !has_c_compiler() {
        return;
    }
    let dir = Scratch::new("dump");
    let dumps = dir.0.join("dumps");
    let c = capture(&[&tensor(&[3, 29], 13).log_softmax(-1).unwrap()]);
    with_config(dir.config(), || compile(&c, None, &[]));
    let hit = with_config(Config { debug_dir: Some(dumps), ..dir.config() }, || compile(&c, None, &[]));
    assert_eq!(hit.times.graph_cache, GraphCacheUse::Hit);
    let folder = hit.dump_dir.clone().expect("dumps are on");
    for file in ["graph_captured.txt", "rewrites.txt", "ir_pre_fusion.txt", "ir_post_fusion.txt", "schedule.txt"] {
        assert!(folder.join(file).is_file(), "{file}");
    }
    let summary = std::fs::read_to_string(folder.join("summary.json")).unwrap();
    assert!(summary.contains("\"graph_cache\": \"hit\""), "{summary}");
    let names: Vec<String> = (std::fs::read_dir(folder.join("kernels")).unwrap().flatten())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().any(|n| n.ends_with(".tile")) && names.iter().any(|n| n.ends_with(".c")), "{names:?}");
}

#[test]
fn binary_sections_round_trip() {
    let launch = |grid| Launch { grid, block: 128, shared_bytes: 4096, per_block: 2, max_grid: 0, cluster: 1 };
    let binaries = [
        Binary::Cpu(None),
        Binary::Cpu(Some("0123abcd".into())),
        Binary::Cuda { nvrtc: None, units: vec![] },
        Binary::Cuda {
            nvrtc: Some((12, 8)),
            units: vec![
                CachedUnit {
                    language: Language::Ptx { level: 4 },
                    key: "k1".into(),
                    kernels: vec![CudaKernel { name: "poi_fused_add_0".into(), launch: launch(0) }],
                    symbols: vec!["coil_kernel".into()],
                },
                CachedUnit {
                    language: Language::CudaC,
                    key: "k2".into(),
                    kernels: vec![
                        CudaKernel { name: "per_a_1".into(), launch: launch(7) },
                        CudaKernel { name: "per_b_2".into(), launch: launch(9) },
                    ],
                    symbols: vec!["per_a_1".into(), "per_b_2".into()],
                },
            ],
        },
    ];
    for b in binaries {
        let text = binary_text(&b);
        assert_eq!(parse_binary(&text), Ok(b), "{text}");
    }
    assert!(parse_binary("cuda\nkernel x y 1 2 3 4 5 6\n").is_err(), "a kernel before its unit");
    assert!(parse_binary("cpu a b").is_err());
    assert!(parse_binary("gpu").is_err());
}

/// On a GPU (skipped without one): hits run bit for bit as misses, with PTX units and with CUDA
/// C units, at static and symbolic sizes; an entry whose CUBINs are gone compiles them again.
#[test]
fn cuda_hits_run_as_misses_and_lost_cubins_are_rebuilt() {
    if !coil_runtime::cuda::cuda_available() {
        return;
    }
    let cuda = Device::Cuda(0);
    let on = |t: Tensor| t.to_device(cuda).unwrap();
    for ptx in [true, false] {
        let dir = Scratch::new(if ptx { "cuda-ptx" } else { "cuda-c" });
        let config = dir.config();
        let config = Config { tuning: Tuning { ptx, ..config.tuning.clone() }, ..config };
        with_config(config, || {
            // a persistent and a looped reduction, random numbers, a data check, bf16
            let soft = on(tensor(&[64, 300], 21)).softmax(-1).unwrap();
            let long = on(tensor(&[4, 100_000], 22)).sum(&[1], false).unwrap();
            let noisy = on(tensor(&[128, 33], 23)).dropout(0.25, true).unwrap();
            let index = on(Tensor::from_vec(vec![3i64, 0, 49, 7, 7, 12, 1], &[7]).unwrap());
            let rows = on(tensor(&[50, 16], 24)).index_select(0, &index).unwrap().exp().unwrap();
            let half = on(tensor(&[32, 40], 25)).to_dtype(DType::BF16).unwrap().gelu(false).unwrap();
            let c = capture(&[&soft, &long, &noisy, &rows, &half]);
            assert_eq!(c.device, cuda);
            let hit = miss_then_hit(&c, None, &[], &[]);
            let Executable::Cuda(g) = &hit.executable else { panic!("compiled for the GPU") };
            assert!(g.cache_hit() && !g.cached_units().is_empty());
            let cuda_c = g.cached_units().iter().any(|u| u.language == Language::CudaC);
            assert!(ptx || cuda_c, "COIL_CUDA_PTX=0 compiles CUDA C");

            // symbolic rows
            let program = |rows: usize, seed: u64| {
                let y = on(tensor(&[rows, 70], seed)).log_softmax(-1).unwrap().sum(&[0], false).unwrap();
                capture(&[&y])
            };
            let c2 = program(6, 26);
            let spec = crate::dynamo::dynamic::resolve(&c2.graph, &[(0, 0)]).unwrap();
            miss_then_hit(&c2, Some(&spec), &[], &[&program(13, 27), &program(2, 28)]);

            // the CUBINs gone: the entry is rebuilt, and so are they
            let expected = run(&hit, &c);
            std::fs::remove_dir_all(dir.0.join("cuda")).unwrap();
            let again = compile(&c, None, &[]);
            assert!(matches!(&again.times.graph_cache, GraphCacheUse::Rebuilt(why) if why.contains("binaries")));
            assert_eq!(run(&again, &c), expected);
            assert_eq!(compile(&c, None, &[]).times.graph_cache, GraphCacheUse::Hit);
        });
    }
}
