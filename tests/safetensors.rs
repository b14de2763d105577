//! Weights in safetensors files (`coil::safetensors`): coil -> file -> coil bit for bit in every
//! dtype, a file PyTorch wrote (`tests/fixtures/torch_written.safetensors`, from
//! `make_safetensors.py` beside it) -> coil, coil -> PyTorch (when `python3` has torch), each
//! loading and saving error, prefix loading, `check`, and casting a set of tensors in one graph.

use coil::safetensors::{self, WeightFile};
use coil::{DType, Device, ErrorKind, Tensor};
use half::{bf16, f16};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// `file:line` of the line before the call site of this macro.
macro_rules! here {
    () => {
        format!("{}:{}", file!(), line!() - 1)
    };
}

/// A directory of its own for one test, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("coil-safetensors-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// Writes raw bytes as `name` and returns its path.
    fn file(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let path = self.path(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A safetensors file from a header text and data bytes.
fn raw(header: &str, data: &[u8]) -> Vec<u8> {
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(data);
    bytes
}

fn tensor<T: coil::Element>(data: Vec<T>, shape: &[usize]) -> Tensor {
    Tensor::from_vec(data, shape).unwrap()
}

/// The tensors of `tests/fixtures/make_safetensors.py`'s `expected()`, value for value: every
/// dtype coil has, with NaN, -0.0, infinities and subnormals, a 0-d and two size-0 tensors.
fn expected() -> Vec<(&'static str, Tensor)> {
    let (inf, nan) = (f32::INFINITY, f32::NAN);
    let halfs = |xs: &[f32]| xs.iter().map(|&x| f16::from_f32(x)).collect::<Vec<_>>();
    let bhalfs = |xs: &[f32]| xs.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>();
    vec![
        ("f32", tensor(vec![0.0f32, -0.0, 1.5, -2.25, inf, -inf, nan, f32::from_bits(1 << 9)], &[2, 4])),
        ("f64", tensor(vec![0.1f64, -0.0, f64::NAN, std::f64::consts::PI], &[2, 2])),
        ("f16", tensor(halfs(&[0.5, -1.0, 65504.0, 2f32.powi(-24), -inf, nan]), &[6])),
        ("bf16", tensor(bhalfs(&[1.0, -2.5, 2f32.powi(100), -0.0, nan, 1.0 / 128.0]), &[2, 3])),
        ("i64", tensor(vec![-(1i64 << 62), 0, 7, (1 << 53) + 1], &[4])),
        ("i32", tensor(vec![i32::MIN, i32::MAX, 3], &[3])),
        ("i16", tensor(vec![i16::MIN, i16::MAX], &[2])),
        ("i8", tensor(vec![-128i8, 127, 0], &[3])),
        ("u8", tensor(vec![0u8, 255, 17], &[3])),
        ("bool", tensor(vec![true, false, true, true], &[2, 2])),
        ("scalar", tensor(vec![3.25f32], &[])),
        ("empty", tensor(Vec::<f32>::new(), &[0, 3])),
        ("empty_i64", tensor(Vec::<i64>::new(), &[2, 0])),
        ("h.0.w", tensor((0..6).map(|i| i as f32 / 4.0).collect(), &[2, 3])),
        ("h.0.b", tensor(vec![1i32, 2, 3], &[3])),
        ("h.1.w", tensor((0..6).map(|i| i as f32 / -4.0).collect(), &[2, 3])),
        ("h.10.w", tensor(halfs(&[0.75]), &[1])),
    ]
}

const METADATA: [(&str, &str); 2] = [("format", "pt"), ("written_by", "make_safetensors.py")];

/// Asserts two tensors have the same dtype, shape and bytes (NaN payloads and -0.0 included).
#[track_caller]
fn assert_same_bits(name: &str, got: &Tensor, want: &Tensor) {
    assert_eq!((got.dtype(), got.shape()), (want.dtype(), want.shape()), "{name}");
    let (got, want) = (got.buffer().unwrap(), want.buffer().unwrap());
    assert_eq!(got.data.to_bytes(), want.data.to_bytes(), "{name}");
}

/// Asserts that `path` holds exactly `expected()` and its metadata.
fn assert_holds_expected(path: &Path) {
    let file = WeightFile::open(path).unwrap();
    let want = expected();
    let mut names: Vec<&str> = want.iter().map(|(n, _)| *n).collect();
    names.sort();
    assert_eq!(file.names(), names);
    let all = file.load_all(Device::Cpu).unwrap();
    for (name, t) in &want {
        assert!(all[*name].is_realized());
        assert_same_bits(name, &all[*name], t);
        assert_same_bits(name, &file.load(name, Device::Cpu).unwrap(), t);
    }
    let metadata: Vec<(&str, &str)> = file.metadata().iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(metadata, METADATA);
}

#[test]
fn every_dtype_round_trips_bit_for_bit() {
    let dir = Scratch::new("round_trip");
    let path = dir.path("all.safetensors");
    // A pending tensor among them is computed before it is written.
    let mut tensors = expected();
    tensors.push(("pending", tensor(vec![1.0f32, 2.0], &[2]).mul(2.0).unwrap()));
    safetensors::save_with_metadata(&path, tensors.iter().map(|(n, t)| (*n, t)), METADATA).unwrap();
    let loaded = safetensors::load(&path, Device::Cpu).unwrap();
    assert_eq!(loaded.len(), tensors.len());
    for (name, t) in &tensors {
        assert_same_bits(name, &loaded[*name], t);
    }
    assert_eq!(loaded["pending"].to_vec::<f32>().unwrap(), [2.0, 4.0]);

    // The same tensors always give the same bytes, which the `safetensors` crate (a second
    // implementation, stricter than coil's reader: no gaps, no trailing bytes) reads back.
    let again = dir.path("again.safetensors");
    safetensors::save_with_metadata(&again, tensors.iter().map(|(n, t)| (*n, t)), METADATA).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(bytes, std::fs::read(&again).unwrap());
    let reference = ::safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(reference.len(), tensors.len());
    for (name, t) in &tensors {
        let view = reference.tensor(name).unwrap();
        assert_eq!(view.shape(), t.shape(), "{name}");
        assert_eq!(format!("{:?}", view.dtype()), WeightFile::open(&path).unwrap().info(name).unwrap().file_dtype);
        assert_eq!(view.data(), t.buffer().unwrap().data.to_bytes(), "{name}");
    }
    // Every tensor starts at a multiple of its element size.
    for info in WeightFile::open(&path).unwrap().tensors().values() {
        assert_eq!(info.data_offsets.0 % info.dtype.unwrap().size_bytes(), 0, "{info:?}");
    }
}

#[test]
fn a_file_pytorch_wrote_loads_bit_for_bit() {
    assert_holds_expected(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/torch_written.safetensors"));
}

#[test]
fn pytorch_reads_what_coil_writes() {
    let dir = Scratch::new("to_torch");
    let path = dir.path("coil_written.safetensors");
    safetensors::save_with_metadata(&path, expected(), METADATA).unwrap();
    assert_holds_expected(&path);
    let has_torch = std::process::Command::new("python3")
        .args(["-c", "import torch, safetensors"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_torch {
        coil_ir::testing::skip("the PyTorch check (python3 with torch and safetensors is not available)");
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/make_safetensors.py");
    let out = std::process::Command::new("python3").arg(script).arg("--check").arg(&path).output().unwrap();
    assert!(out.status.success(), "PyTorch disagrees:\n{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn prefix_loading_takes_exactly_the_names_under_the_prefix() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/torch_written.safetensors");
    let file = WeightFile::open(&path).unwrap();
    let block1 = file.load_prefix("h.1.", Device::Cpu).unwrap();
    assert_eq!(block1.keys().collect::<Vec<_>>(), ["h.1.w"]); // not h.10.w
    let block0 = file.load_prefix("h.0.", Device::Cpu).unwrap();
    assert_eq!(block0.keys().collect::<Vec<_>>(), ["h.0.b", "h.0.w"]);
    assert_eq!(block0["h.0.w"].to_vec::<f32>().unwrap(), [0.0, 0.25, 0.5, 0.75, 1.0, 1.25]);
    let e = file.load_prefix("h.2.", Device::Cpu).unwrap_err();
    let at = here!();
    assert_eq!(e.kind, ErrorKind::Value);
    let msg = e.to_string();
    assert!(msg.contains("no tensor's name starts with 'h.2.'") && msg.contains(&at), "{msg}");
}

#[test]
fn cast_all_is_one_graph_and_leaves_tensors_of_the_dtype_alone() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/torch_written.safetensors");
    let file = WeightFile::open(&path).unwrap();
    let names = ["f32", "f64", "f16", "bf16", "i64", "h.0.w", "h.1.w"];
    let loaded: Vec<Tensor> = names.iter().map(|n| file.load(n, Device::Cpu).unwrap()).collect();
    let report = coil::explain(|| safetensors::cast_all(&loaded, DType::BF16)).unwrap();
    assert_eq!(report.graph_count, 1, "{report}");
    let casts = report.graphs[0].ops.iter().filter(|(op, _)| op == "cast").count();
    assert_eq!(casts, names.len() - 1, "{report}");
    let cast = &report.outputs;
    assert!(Arc::ptr_eq(&cast[3].buffer().unwrap(), &loaded[3].buffer().unwrap()), "bf16 was copied");
    for ((name, got), t) in names.iter().zip(cast).zip(&loaded) {
        let want = t.to_dtype(DType::BF16).unwrap();
        assert_same_bits(name, got, &want);
    }
    // Over a map, by name.
    let all = file.load_prefix("h.", Device::Cpu).unwrap();
    let half = safetensors::cast_map(&all, DType::F16).unwrap();
    assert!(half.keys().eq(all.keys()) && half.values().all(|t| t.dtype() == DType::F16 && t.is_realized()));
}

#[test]
fn check_reports_every_problem_in_one_error() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/torch_written.safetensors");
    let file = WeightFile::open(&path).unwrap();
    let exact: Vec<(String, Vec<usize>, DType)> =
        expected().iter().map(|(n, t)| (n.to_string(), t.shape().to_vec(), t.dtype())).collect();
    file.check(&exact).unwrap();
    file.check_subset(&exact[..3]).unwrap();

    let mut wrong = exact.clone();
    wrong.retain(|(n, ..)| n != "h.10.w" && n != "i8"); // unexpected in the file: h.10.w, i8
    wrong.iter_mut().find(|(n, ..)| n == "f32").unwrap().1 = vec![4, 2]; // shape mismatch
    wrong.iter_mut().find(|(n, ..)| n == "bf16").unwrap().2 = DType::F32; // dtype mismatch
    wrong.iter_mut().find(|(n, ..)| n == "h.0.b").unwrap().0 = "h.O.b".into(); // missing (a letter O)
    let e = file.check(&wrong).unwrap_err();
    let at = here!();
    assert_eq!(e.kind, ErrorKind::Value);
    let msg = e.to_string();
    for part in [
        &format!("value error in safetensors check at {at}: "),
        "torch_written.safetensors: 6 problems against the 15 tensors expected: ",
        "missing: 'h.O.b' (did you mean 'h.0.b'?); ",
        "unexpected: 'h.0.b', 'h.10.w', 'i8'; ",
        "shape mismatch: 'f32' is [2, 4] in the file, [4, 2] expected; ",
        "dtype mismatch: 'bf16' is bf16 in the file, f32 expected",
    ] {
        assert!(msg.contains(part), "{msg}\nlacks: {part}");
    }
    // Unexpected names are fine for check_subset; the other problems are not.
    let e = file.check_subset(&wrong).unwrap_err();
    assert!(!e.to_string().contains("unexpected") && e.to_string().contains("3 problems"), "{e}");
    // One kind of problem: that kind.
    let e = file.check_subset(&[("f32", vec![8], DType::F32), ("i8", vec![1], DType::I8)]).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Shape, "{e}");
    let e = file.check_subset(&[("u8", vec![3], DType::I8)]).unwrap_err();
    assert_eq!(e.kind, ErrorKind::DType, "{e}");
}

#[test]
fn a_missing_name_says_what_the_file_has() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/torch_written.safetensors");
    let file = WeightFile::open(&path).unwrap();
    let e = file.load("h0.w", Device::Cpu).unwrap_err();
    let at = here!();
    assert_eq!(e.kind, ErrorKind::Value);
    let msg = e.to_string();
    assert!(msg.starts_with(&format!("value error in safetensors load at {at}: ")), "{msg}");
    assert!(msg.contains("torch_written.safetensors: no tensor 'h0.w' (did you mean 'h.0.w'?)"), "{msg}");
    assert!(msg.contains("the file has 17 tensors: 'bf16', 'bool'"), "{msg}");
}

/// Opens `bytes` as a file and returns the error's kind and text.
fn open_error(dir: &Scratch, name: &str, bytes: &[u8]) -> (ErrorKind, String) {
    let e = WeightFile::open(dir.file(name, bytes)).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains(&format!("{name}: ")), "{msg} does not name the file");
    assert_eq!(e.op.as_deref(), Some("safetensors open"));
    (e.kind, msg)
}

#[test]
fn bad_files_are_errors_that_say_what_is_wrong() {
    let dir = Scratch::new("bad_files");
    let good = raw(r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#, &[0; 8]);
    let cases: Vec<(&str, Vec<u8>, ErrorKind, &str)> = vec![
        ("empty", vec![], ErrorKind::Value, "truncated: 0 bytes, shorter than the 8-byte header length"),
        (
            "short_header",
            good[..20].to_vec(),
            ErrorKind::Value,
            "truncated: the header is 54 bytes long, but only 12 bytes",
        ),
        (
            "short_data",
            good[..good.len() - 1].to_vec(),
            ErrorKind::Value,
            "tensor 'a' lies at data bytes [0, 8), past the end of the data section (7 bytes): the file is truncated",
        ),
        (
            "huge_header",
            [200_000_000u64.to_le_bytes(), [b'{'; 8]].concat(),
            ErrorKind::Value,
            "header too large: 200000000 bytes",
        ),
        ("not_json", raw("{\"a\": [1, 2", &[]), ErrorKind::Value, "corrupt header: not JSON"),
        ("not_utf8", [&2u64.to_le_bytes()[..], &[0xff, 0xfe]].concat(), ErrorKind::Value, "corrupt header: not UTF-8"),
        (
            "not_object",
            raw("[1, 2]", &[]),
            ErrorKind::Value,
            "corrupt header: a JSON array where an object of tensors belongs",
        ),
        (
            "no_dtype",
            raw(r#"{"a":{"shape":[],"data_offsets":[0,0]}}"#, &[]),
            ErrorKind::Value,
            "tensor 'a': no \"dtype\"",
        ),
        (
            "unknown_dtype",
            raw(r#"{"a":{"dtype":"Q7","shape":[],"data_offsets":[0,1]}}"#, &[0]),
            ErrorKind::Value,
            "corrupt header: tensor 'a': unknown dtype \"Q7\"",
        ),
        (
            "bad_shape",
            raw(r#"{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}"#, &[0; 4]),
            ErrorKind::Value,
            "tensor 'a': \"shape\" is not a list of sizes",
        ),
        (
            "length_mismatch",
            raw(r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#, &[0; 8]),
            ErrorKind::Value,
            "tensor 'a': data_offsets [0, 8] hold 8 bytes, but F32 [3] takes 12",
        ),
        (
            "backwards",
            raw(r#"{"a":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}}"#, &[0; 4]),
            ErrorKind::Value,
            "tensor 'a': data_offsets [4, 0] end before they begin",
        ),
        (
            "out_of_range",
            raw(r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[100,104]}}"#, &[0; 4]),
            ErrorKind::Value,
            "tensor 'a' lies at data bytes [100, 104), past the end of the data section (4 bytes)",
        ),
        (
            "overlap",
            raw(
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"I32","shape":[1],"data_offsets":[4,8]}}"#,
                &[0; 8],
            ),
            ErrorKind::Value,
            "tensors 'a' (data bytes [0, 8)) and 'b' ([4, 8)) overlap",
        ),
        (
            "bad_metadata",
            raw(r#"{"__metadata__":{"step":3}}"#, &[]),
            ErrorKind::Value,
            "corrupt header: __metadata__ 'step' is a JSON number, not a string",
        ),
    ];
    for (name, bytes, kind, wanted) in cases {
        let (got_kind, msg) = open_error(&dir, name, &bytes);
        assert_eq!(got_kind, kind, "{name}: {msg}");
        assert!(msg.contains(wanted), "{name}: {msg}\nlacks: {wanted}");
    }
    WeightFile::open(dir.file("good", &good)).unwrap();

    let e = WeightFile::open(dir.path("absent.safetensors")).unwrap_err();
    let at = here!();
    assert_eq!(e.kind, ErrorKind::Runtime);
    assert!(e.to_string().starts_with(&format!("runtime error in safetensors open at {at}: ")), "{e}");
    assert!(e.to_string().contains("absent.safetensors: cannot open"), "{e}");
    let e = WeightFile::open(&dir.0).unwrap_err();
    assert!(e.to_string().contains("not a regular file"), "{e}");
}

#[test]
fn a_dtype_coil_lacks_is_an_error_naming_the_tensor() {
    let dir = Scratch::new("unsupported");
    let header = r#"{"ok":{"dtype":"I32","shape":[1],"data_offsets":[0,4]},"counts":{"dtype":"U32","shape":[1],"data_offsets":[4,8]},"fp8":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[8,10]}}"#;
    let file = WeightFile::open(dir.file("u32.safetensors", &raw(header, &[7, 0, 0, 0, 1, 0, 0, 0, 0, 0]))).unwrap();
    assert_eq!(file.info("counts").unwrap().dtype, None);
    assert_eq!(file.info("counts").unwrap().file_dtype, "U32");
    let e = file.load("counts", Device::Cpu).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unsupported);
    assert!(e.to_string().contains("tensor 'counts': dtype U32 is not one coil has (coil has bool, u8"), "{e}");
    let e = file.load_all(Device::Cpu).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unsupported);
    assert!(e.to_string().contains("2 tensors of dtypes coil lacks: 'counts' (U32), 'fp8' (F8_E4M3)"), "{e}");
    assert_eq!(file.load("ok", Device::Cpu).unwrap().to_vec::<i32>().unwrap(), [7]);
    let e = file.check(&[("ok", vec![1], DType::I32), ("counts", vec![1], DType::I64)]).unwrap_err();
    assert!(e.to_string().contains("'counts' is U32 (a dtype coil lacks) in the file, i64 expected"), "{e}");

    let bad_bool = raw(r#"{"m":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}}"#, &[1, 0, 2]);
    let e = WeightFile::open(dir.file("bool.safetensors", &bad_bool)).unwrap().load("m", Device::Cpu).unwrap_err();
    assert!(e.to_string().contains("tensor 'm': bool element 2 is byte 2 (a bool is 0 or 1)"), "{e}");
}

#[test]
fn saving_is_atomic_and_checks_names() {
    let dir = Scratch::new("save");
    let t = tensor(vec![1.0f32], &[1]);
    let e = safetensors::save(dir.path("dup.safetensors"), [("w", &t), ("w", &t)]).unwrap_err();
    let at = here!();
    assert_eq!(e.kind, ErrorKind::Value);
    assert!(e.to_string().starts_with(&format!("value error in safetensors save at {at}: ")), "{e}");
    assert!(e.to_string().contains("dup.safetensors: the name 'w' is given twice"), "{e}");
    let e = safetensors::save(dir.path("meta.safetensors"), [("__metadata__", &t)]).unwrap_err();
    assert!(e.to_string().contains("'__metadata__' is reserved"), "{e}");

    // An existing file is replaced whole; a failed save leaves it and no temporary file.
    let path = dir.path("model.safetensors");
    safetensors::save(&path, [("w", &t)]).unwrap();
    let mapped = WeightFile::open(&path).unwrap();
    safetensors::save(&path, [("w", &tensor(vec![2.0f32, 3.0], &[2]))]).unwrap();
    assert_eq!(mapped.load("w", Device::Cpu).unwrap().to_vec::<f32>().unwrap(), [1.0]); // the old file, still mapped
    assert_eq!(safetensors::load(&path, Device::Cpu).unwrap()["w"].to_vec::<f32>().unwrap(), [2.0, 3.0]);
    let occupied = dir.path("occupied");
    std::fs::create_dir(&occupied).unwrap();
    std::fs::write(occupied.join("x"), b"x").unwrap();
    let e = safetensors::save(&occupied, [("w", &t)]).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Runtime);
    assert!(e.to_string().contains("cannot rename"), "{e}");
    let e = safetensors::save(dir.path("no/such/dir/m.safetensors"), [("w", &t)]).unwrap_err();
    assert!(e.to_string().contains("cannot create the temporary file"), "{e}");
    let mut left: Vec<String> =
        std::fs::read_dir(&dir.0).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    left.sort();
    assert_eq!(left, ["model.safetensors", "occupied"]);
}

#[test]
fn loads_onto_a_gpu_as_on_the_cpu() {
    if coil_runtime::testing::cuda_device().is_none() {
        return;
    }
    let gpu = Device::Cuda(0);
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/torch_written.safetensors");
    let file = WeightFile::open(&path).unwrap();
    let on_gpu = file.load_all(gpu).unwrap();
    for (name, want) in expected() {
        assert_eq!(on_gpu[name].device(), gpu);
        assert_same_bits(name, &on_gpu[name].to_device(Device::Cpu).unwrap(), &want);
    }
    let floats: Vec<&Tensor> = ["f32", "f16", "bf16", "h.0.w"].iter().map(|n| &on_gpu[*n]).collect();
    let report = coil::explain(|| safetensors::cast_all(floats.iter().copied(), DType::F32)).unwrap();
    assert_eq!(report.graph_count, 1, "{report}");
    for (got, name) in report.outputs.iter().zip(["f32", "f16", "bf16", "h.0.w"]) {
        assert_eq!(got.device(), gpu);
        // Values and signed zeros as on the CPU; a NaN stays NaN, but CUDA's conversions do not
        // keep a NaN's payload (docs/compiler.md, "CUDA backend").
        let want = file.load(name, Device::Cpu).unwrap().to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
        let got = got.to_vec::<f32>().unwrap();
        let same = |a: &f32, b: &f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
        assert!(
            got.len() == want.len() && got.iter().zip(&want).all(|(a, b)| same(a, b)),
            "{name}: {got:?} vs {want:?}"
        );
    }
    // Saving a GPU tensor brings it to the host.
    let dir = Scratch::new("gpu");
    let path = dir.path("g.safetensors");
    safetensors::save(&path, [("w", &on_gpu["bf16"])]).unwrap();
    assert_same_bits(
        "w",
        &safetensors::load(&path, Device::Cpu).unwrap()["w"],
        &file.load("bf16", Device::Cpu).unwrap(),
    );
}
