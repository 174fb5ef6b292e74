//! Manifest loading and compiling (the controller's `compile::load` as a directory scan
//! uses it, then `compile`), on arbitrary YAML text. Checks, besides not panicking (a panic
//! would stop `tollgate run` or the controller's reconcile): compiling is deterministic, and
//! its output serializes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate::compile::compile;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(inputs) = tollgate::fuzzing::load(text) else {
        return;
    };
    let out = compile(&inputs);
    assert_eq!(out, compile(&inputs), "compile is not deterministic");
    serde_json::to_vec(&out).expect("the output serializes");
});
