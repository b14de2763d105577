//! coil's byte-level BPE tokenizer against Hugging Face's `tokenizers`: two small tokenizers
//! trained by `fixtures/make_tokenizers.py` (Llama 3's pattern, `ignore_merges` and template;
//! GPT-2's), and their encodings and decodings of edge-case strings.

use coil_nn::tokenizer::Pattern;
use coil_nn::Tokenizer;
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

#[test]
fn encodings_match_hugging_face() {
    let cases: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("tokenizer_cases.json")).unwrap()).unwrap();
    for (name, pattern) in [("llama3", Pattern::Llama3), ("gpt2", Pattern::Gpt2)] {
        let t = Tokenizer::from_file(fixture(&format!("tokenizer_{name}.json"))).unwrap();
        assert_eq!(t.pattern(), pattern);
        for case in cases[name].as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            let ids = |key: &str| -> Vec<i64> { serde_json::from_value(case[key].clone()).unwrap() };
            assert_eq!(t.encode(text, false).unwrap(), ids("ids"), "{name}: {text:?}");
            assert_eq!(t.encode(text, true).unwrap(), ids("ids_special"), "{name}, special tokens: {text:?}");
            assert_eq!(t.decode(&ids("ids")).unwrap(), case["decoded"].as_str().unwrap(), "{name}: {text:?}");
        }
    }
}

#[test]
fn unsupported_tokenizers_and_ids_are_errors() {
    let json = std::fs::read_to_string(fixture("tokenizer_llama3.json")).unwrap();
    let other = json.replace(r"\\p{N}{1,3}", r"\\p{N}{1,4}");
    assert!(other != json, "the fixture's pattern changed");
    let e = Tokenizer::from_json(&other).unwrap_err().to_string();
    assert!(e.contains("pre-tokenizer split"), "{e}");
    let sentencepiece = json.replace("\"byte_fallback\": false", "\"byte_fallback\": true");
    assert!(sentencepiece != json, "the fixture has no byte_fallback field");
    let e = Tokenizer::from_json(&sentencepiece).unwrap_err().to_string();
    assert!(e.contains("byte fallback"), "{e}");
    let t = Tokenizer::from_json(&json).unwrap();
    let e = t.decode(&[1 << 40]).unwrap_err().to_string();
    assert!(e.contains("not in the vocabulary"), "{e}");
    assert_eq!(t.token_id("<|begin_of_text|>"), Some(0));
}
