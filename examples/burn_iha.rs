//! Training a small decoder with IHA layers in Burn (attnc-burn): the IHA
//! paper's schedule, sliding-window IHA layers then a global one, on a
//! synthetic associative-recall task (key–value pairs, then a key: predict
//! its value), with Burn's Adam on the wgpu device (lavapipe without a
//! GPU). Prints the loss as it falls, then times a training step against
//! the same decoder with Burn's own attention (`burn::tensor::module::
//! attention`, cubek-attention) in place of IHA, on the same device.
//!
//!     cargo run --release --example burn_iha [-- STEPS]

use attnc_burn::{AttncLayer, AttncOp, Inputs};
use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig};
use burn::optim::{AdamConfig, GradientsParams};
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Device, DeviceKind, Int, Tensor, TensorData};
use std::time::Instant;

/// Keys 0..KEYS, values KEYS..KEYS + VALUES; PAIRS pairs then the query.
const KEYS: usize = 16;
const VALUES: usize = 16;
const PAIRS: usize = 8;
const N: usize = 2 * PAIRS + 1;
const BATCH: usize = 32;
/// Heads, pseudo-heads, head width: model width D = H · d.
const H: usize = 2;
const P: usize = 2;
const HEAD: usize = 16;
const D: usize = H * HEAD;

/// Embedding, attention layers with residuals, a readout of the last token.
#[derive(Module, Debug)]
struct Decoder<A> {
    embed: Embedding,
    layers: Vec<A>,
    out: Linear,
}

/// An attention layer of the decoder: `[B, N, D]` to `[B, N, D]`.
trait Mixer {
    fn mix(&self, x: Tensor<3>) -> Tensor<3>;
}

impl Mixer for AttncLayer {
    fn mix(&self, x: Tensor<3>) -> Tensor<3> {
        let mut out = self.forward(Inputs::new().with("x", x)).unwrap_or_else(|e| panic!("{e}"));
        out.take::<3>("y").unwrap_or_else(|e| panic!("{e}"))
    }
}

/// Causal multi-head attention with Burn's own kernel.
#[derive(Module, Debug)]
struct BurnAttention {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
}

impl Mixer for BurnAttention {
    fn mix(&self, x: Tensor<3>) -> Tensor<3> {
        let heads = |t: Tensor<3>| t.reshape([BATCH, N, H, HEAD]).swap_dims(1, 2);
        let (q, k, v) = (heads(self.q.forward(x.clone())), heads(self.k.forward(x.clone())), heads(self.v.forward(x)));
        let options = AttentionModuleOptions { scale: None, softcap: None, is_causal: true };
        let y = attention(q, k, v, None, None, options).swap_dims(1, 2).reshape([BATCH, N, D]);
        self.o.forward(y)
    }
}

impl<A: Mixer + Module + burn::module::ModuleDisplay> Decoder<A> {
    /// Logits of the token after the last, `[B, KEYS + VALUES]`.
    fn logits(&self, tokens: Tensor<2, Int>) -> Tensor<2> {
        let mut x = self.embed.forward(tokens);
        for layer in &self.layers {
            x = x.clone() + layer.mix(x);
        }
        self.out.forward(x.slice([0..BATCH, N - 1..N, 0..D]).reshape([BATCH, D]))
    }
}

/// A batch of recall problems from a small generator: tokens and targets.
fn batch(seed: &mut u64, device: &Device) -> (Tensor<2, Int>, Tensor<1, Int>) {
    let mut next = || {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (*seed >> 33) as usize
    };
    let (mut tokens, mut targets) = (Vec::with_capacity(BATCH * N), Vec::with_capacity(BATCH));
    for _ in 0..BATCH {
        let mut keys: Vec<usize> = (0..KEYS).collect();
        for i in (1..KEYS).rev() {
            keys.swap(i, next() % (i + 1));
        }
        let values: Vec<usize> = (0..PAIRS).map(|_| KEYS + next() % VALUES).collect();
        for p in 0..PAIRS {
            tokens.extend([keys[p] as i64, values[p] as i64]);
        }
        let asked = next() % PAIRS;
        tokens.push(keys[asked] as i64);
        targets.push(values[asked] as i64);
    }
    (
        Tensor::from_data(TensorData::new(tokens, [BATCH, N]), device),
        Tensor::from_data(TensorData::new(targets, [BATCH]), device),
    )
}

/// `steps` Adam steps on `model`; the losses, and the mean seconds of a
/// step after the first (which compiles the kernels).
fn train<A: Mixer + Module + burn::module::ModuleDisplay>(
    mut model: Decoder<A>,
    steps: usize,
    device: &Device,
) -> (Vec<f32>, f64) {
    let mut opt = AdamConfig::new().init();
    let loss_fn = CrossEntropyLossConfig::new().init(device);
    let mut seed = 1;
    let (mut losses, mut timed) = (vec![], 0.0);
    for step in 0..steps {
        let start = Instant::now();
        let (tokens, targets) = batch(&mut seed, device);
        let loss = loss_fn.forward(model.logits(tokens), targets);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = opt.step(3e-3, model, grads);
        losses.push(loss.into_data().try_to_vec::<f32>().expect("f32 loss")[0]);
        if step > 0 {
            timed += start.elapsed().as_secs_f64();
        }
    }
    (losses, timed / (steps - 1).max(1) as f64)
}

/// One IHA layer's gradients through Burn's autodiff (x's and every
/// weight's, for `loss = Σ y · c`) against attnc's gradient program in
/// float64 (what `attnc grad` computes) at the same weights, x and c:
/// relative error ≤ 1e-4 each.
fn check_gradients(op: &AttncOp, device: &Device) {
    use attnc_runtime::{bind, interp, rng::Rng, Tensor as Host};
    let program = op.program();
    let seed = 5;
    let layer = AttncLayer::new(op.clone(), seed, device).unwrap_or_else(|e| panic!("{e}"));
    let defaults = bind::default_dims(program).unwrap();
    let mut rng = Rng::for_input(seed, "check");
    let mut draw = |shape: &[usize]| {
        Host::new(shape.to_vec(), (0..shape.iter().product()).map(|_| rng.unit() * 2.0 - 1.0).collect())
    };
    let (x, c) = (draw(&[BATCH, N, D]), draw(&[BATCH, N, D]));
    let tensors: Vec<Host> = (program.inputs.iter().enumerate())
        .map(|(i, input)| if input.weight { bind::draw_input(program, i, &defaults, seed) } else { x.clone() })
        .collect();
    let shapes: Vec<&[usize]> = tensors.iter().map(|t| t.shape.as_slice()).collect();
    let dims = bind::solve_dims(program, &shapes, &Default::default()).unwrap();
    let names: Vec<String> = program.inputs.iter().map(|i| i.name.clone()).collect();
    let grad = attnc_compiler::grad::differentiate(program, &names).unwrap();
    let want = interp::evaluate(&grad, &[tensors.clone(), vec![c.clone()]].concat(), &dims);
    let burn = |t: &Host| {
        Tensor::<3>::from_data(TensorData::new(t.data.iter().map(|&v| v as f32).collect(), t.shape.clone()), device)
    };
    let xb = burn(&x).require_grad();
    let y = layer.forward(Inputs::new().with("x", xb.clone())).unwrap().take::<3>("y").unwrap();
    let grads = (y * burn(&c)).sum().backward();
    let values = |d: burn::tensor::TensorData| -> Vec<f64> {
        d.try_to_vec::<f32>().expect("f32").into_iter().map(f64::from).collect()
    };
    let mut worst = 0.0f64;
    for (input, t) in program.inputs.iter().zip(&tensors) {
        let got = match (input.weight, t.shape.len()) {
            (false, _) => xb.grad(&grads).map(|g| values(g.into_data())),
            (true, 2) => layer.weight::<2>(&input.name).and_then(|w| w.grad(&grads)).map(|g| values(g.into_data())),
            (true, 3) => layer.weight::<3>(&input.name).and_then(|w| w.grad(&grads)).map(|g| values(g.into_data())),
            (true, r) => panic!("weight {} of rank {r}", input.name),
        };
        let got = got.unwrap_or_else(|| panic!("no gradient for {}", input.name));
        let at = grad.outputs.iter().position(|(n, _)| *n == format!("grad_{}", input.name)).unwrap();
        let e = attnc_runtime::relative_error(&got, &want[at].data);
        assert!(e <= 1e-4 && got.iter().all(|v| v.is_finite()), "{}: relative error {e:e}", input.name);
        worst = worst.max(e);
    }
    println!("gradients of x and the {} weights against attnc's: relative error ≤ {worst:.1e}", names.len() - 1);
}

fn main() {
    let steps: usize = std::env::args().nth(1).map_or(60, |s| s.parse().expect("STEPS is a number"));
    let device = Device::wgpu(DeviceKind::DefaultDevice).autodiff();
    let spec = format!("{}/stdlib/iha.attn", env!("CARGO_MANIFEST_DIR"));
    let (h, p, d) = (H.to_string(), P.to_string(), HEAD.to_string());
    let iha = |window: &str, seed| {
        let op = AttncOp::from_file(&spec, &[("H", &h), ("P", &p), ("d", &d), ("window", window)])
            .unwrap_or_else(|e| panic!("{e}"));
        AttncLayer::new(op, seed, &device).unwrap_or_else(|e| panic!("{e}"))
    };
    let window = AttncOp::from_file(&spec, &[("H", &h), ("P", &p), ("d", &d), ("window", "4")])
        .unwrap_or_else(|e| panic!("{e}"));
    check_gradients(&window, &device);
    let vocabulary = KEYS + VALUES;
    let embed = || EmbeddingConfig::new(vocabulary, D).init(&device);
    let out = || LinearConfig::new(D, vocabulary).init(&device);
    // Two sliding-window IHA layers (4 tokens), then a global one.
    let model = Decoder { embed: embed(), layers: vec![iha("4", 1), iha("4", 2), iha("none", 3)], out: out() };
    println!("IHA decoder (H={H} P={P} d={HEAD}, N={N}, batch {BATCH}): {} parameters", model.num_params());
    let (losses, iha_step) = train(model, steps, &device);
    for (step, loss) in losses.iter().enumerate().filter(|(s, _)| s % 10 == 0 || *s + 1 == steps) {
        println!("step {step:3}: loss {loss:.4}");
    }
    let first: f32 = losses[..5.min(steps)].iter().sum::<f32>() / 5.0f32.min(steps as f32);
    let last: f32 = losses[steps.saturating_sub(5)..].iter().sum::<f32>() / 5.0f32.min(steps as f32);
    println!("mean loss over the first 5 steps {first:.4}, over the last 5 {last:.4}");
    // The same decoder with Burn's attention, timed on the same device.
    let lin = || LinearConfig::new(D, D).init(&device);
    let layer = || BurnAttention { q: lin(), k: lin(), v: lin(), o: lin() };
    let burn = Decoder { embed: embed(), layers: vec![layer(), layer(), layer()], out: out() };
    let (_, burn_step) = train(burn, 11.min(steps), &device);
    println!(
        "a training step: IHA (attnc) {:.1} ms, MHA (Burn's attention) {:.1} ms: ratio {:.2}",
        iha_step * 1e3,
        burn_step * 1e3,
        iha_step / burn_step
    );
    assert!(last < first, "the loss did not fall: {losses:?}");
}
