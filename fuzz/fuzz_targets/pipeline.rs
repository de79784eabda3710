//! Grammar-aware mutation of the shipped specs through the whole pipeline up
//! to emitted WGSL and CUDA: the input picks a spec and edits its tokens
//! (numbers, names, operators, whole lines), then checks, optimizes, plans
//! and emits. Errors are fine; panics, hangs and unbounded work are not.
#![no_main]

use attnc_compiler::opt::Config;
use attnc_runtime::gpu::emit;
use attnc_runtime::pipeline::{Backend, Compiler};
use libfuzzer_sys::fuzz_target;

const SPECS: &[&str] = &[
    include_str!("../../stdlib/mha.attn"),
    include_str!("../../stdlib/gqa.attn"),
    include_str!("../../stdlib/mqa.attn"),
    include_str!("../../stdlib/iha.attn"),
    include_str!("../../stdlib/grpo.attn"),
    include_str!("../../stdlib/dr_grpo.attn"),
    include_str!("../../stdlib/rloo.attn"),
    include_str!("../../stdlib/maxrl.attn"),
    include_str!("../../stdlib/gdpo.attn"),
    include_str!("../../stdlib/odrpo.attn"),
    include_str!("../../stdlib/alibi.attn"),
    include_str!("../../stdlib/softcap.attn"),
    include_str!("../../stdlib/document.attn"),
    include_str!("../../stdlib/relative_bias.attn"),
    include_str!("../../stdlib/sinks.attn"),
    include_str!("../../stdlib/kvcache.attn"),
    include_str!("../../stdlib/gpt_oss.attn"),
    include_str!("../../stdlib/talking_heads.attn"),
];

const REPLACEMENTS: &[&str] = &[
    "0", "1", "2", "3", "7", "64", "-1", "1e30", "0.5", "none", "true", "H", "P", "d", "N", "B", "G", "K", "x", "q",
    "causal", "token_causal", "all", "*", "+", "@", "/", "(", ")", "[", "]", ",", "=", "==", "let", "output",
    "attention(q, k, v)", "mean(rewards, axis = 1)", "split_heads(x, 3)", "interleave(q)", "where(1, 2, 3)",
    "i - j", "i * 100000 * 100000", "floordiv(i, 0)", "j % 7", "0.0 / 0.0", "log(0.0)", "1e39", "2147483647", "not",
    "and", "or", "s", "|", "sigmoid", "linear", "hard", "bias[h, i - j]",
];

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let spec = SPECS[data[0] as usize % SPECS.len()];
    let mut tokens: Vec<String> = spec.split_inclusive(|c: char| c.is_whitespace()).map(str::to_string).collect();
    for edit in data[1..].chunks(3) {
        let [op, at, with] = match edit {
            [a, b, c] => [*a, *b, *c],
            _ => break,
        };
        if tokens.is_empty() {
            break;
        }
        let i = at as usize * tokens.len() / 256;
        let replacement = REPLACEMENTS[with as usize % REPLACEMENTS.len()].to_string() + " ";
        match op % 4 {
            0 => tokens[i] = replacement,
            1 => tokens.insert(i, replacement),
            2 => {
                tokens.remove(i);
            }
            _ => {
                let t = tokens[i].clone();
                tokens.insert(i, t);
            }
        }
    }
    let text: String = tokens.concat();
    // The library pipeline, as users call it.
    let Ok(program) = Compiler::new("fuzz.attn", text).compile() else { return };
    let Ok(bound) = program.sized() else { return };
    // Keep each execution bounded: refuse what a run would refuse.
    if bound.check_limits(Backend::Wgpu, 64 << 20, f64::INFINITY).is_err() {
        return;
    }
    let cfg = Config { iter_limit: 6, node_limit: 2_000, ..Default::default() };
    let (bound, _) = bound.optimize_with(&cfg);
    assert!(attnc_compiler::valid::validate(bound.program()).is_empty());
    if bound.plan().launches.len() <= 64 {
        let _ = bound.emit(emit::Target::Wgsl);
        let _ = bound.emit(emit::Target::Cuda);
    }
});
