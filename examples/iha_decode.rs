//! Generating with IHA one token at a time: `stdlib/iha_decode.attn` takes
//! the new token and the cache of earlier tokens' pseudo-keys and
//! pseudo-values, returns the token's output and its rows to append. Each
//! step's output becomes the next token (scaled to unit RMS), and at the
//! end the whole generated sequence goes through `stdlib/iha.attn` in one
//! forward: every step must equal its row. Kernels on wgpu (lavapipe on a
//! CPU). `cargo run --release --example iha_decode`
use attnc::{Backend, Compiler, Tensor};
use std::collections::BTreeMap;

const TOKENS: usize = 24;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let params = [("H", "4"), ("P", "2"), ("d", "32"), ("mask", "flat_causal"), ("rope", "10000.0")];
    let spec = |path: &str, n: usize| {
        params.iter().fold(Compiler::open(path), |c, (k, v)| c.map(|c| c.set(k, v))).map(|c| c.set("N", n))
    };
    // Weights (and a first token) drawn as `attnc run --seed 0` draws them.
    let drawn = spec("stdlib/iha.attn", 1)?.compile()?.seeded(0)?.inputs().clone();
    let weights: BTreeMap<String, Tensor> =
        drawn.iter().filter(|(n, _)| *n != "x").map(|(n, t)| (n.clone(), t.clone())).collect();
    let (h, d) = (4, 32);

    let mut x = drawn["x"].clone(); // [1, 1, D]
    let mut cache = [Tensor::new(vec![1, h, 0, d], vec![]), Tensor::new(vec![1, h, 0, d], vec![])];
    let (mut tokens, mut outputs) = (vec![], vec![]);
    for t in 0..TOKENS {
        let mut inputs = weights.clone();
        inputs.insert("x".into(), x.clone());
        inputs.insert("k_cache".into(), cache[0].clone());
        inputs.insert("v_cache".into(), cache[1].clone());
        let out = spec("stdlib/iha_decode.attn", t + 1)?.compile()?.bind(inputs)?.run(Backend::Wgpu)?;
        cache = [cache[0].concat(&out["k_new"], 2), cache[1].concat(&out["v_new"], 2)];
        tokens.push(x.data.clone());
        let y = out["y"].clone();
        let rms = (y.data.iter().map(|v| v * v).sum::<f64>() / y.len() as f64).sqrt();
        x = Tensor::new(y.shape.clone(), y.data.iter().map(|v| v / rms).collect());
        outputs.push(y);
    }
    println!("decoded {TOKENS} tokens; cache {:?}", cache[0].shape);

    // The whole sequence in one forward.
    let mut inputs = weights;
    inputs.insert("x".into(), Tensor::new(vec![1, TOKENS, h * d], tokens.concat()));
    let full = &spec("stdlib/iha.attn", TOKENS)?.compile()?.bind(inputs)?.run(Backend::Wgpu)?["y"];
    let row = |t: usize| &full.data[t * h * d..(t + 1) * h * d];
    let worst = (0..TOKENS).map(|t| attnc::relative_error(&outputs[t].data, row(t))).fold(0.0, f64::max);
    println!("largest relative error of a step against the full forward's row: {worst:.2e}");
    if worst > 1e-4 {
        return Err(format!("a decode step differs from the full forward by {worst:e}").into());
    }
    Ok(())
}
