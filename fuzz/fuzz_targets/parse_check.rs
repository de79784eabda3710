//! Arbitrary bytes through the parser and the checker: errors are fine, panics are not.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(spec) = attnc_grammar::parse(&text) {
        // The printer's output must parse back to the same tree.
        let printed = attnc_grammar::print_spec(&spec);
        let again = attnc_grammar::parse(&printed).expect("printed specs parse");
        assert_eq!(again.without_spans(), spec.without_spans());
    }
    if let Err(diags) = attnc_compiler::compile(&text, &[]) {
        let _ = attnc_compiler::render("fuzz.attn", &text, &diags);
    }
});
