//! What attnc-burn adds to attnc: a training step of causal attention
//! (forward and backward, q, k, v differentiated) through Burn's autodiff
//! against the same two programs (`grad::split`'s halves) run by attnc
//! directly on the same client and buffers, alternately in one run; and
//! Burn's own attention (cubek-attention) at the same sizes beside them.
//!
//!     cargo run --release --example burn_overhead [-- H N d ITERS]

use attnc_burn::{AttncOp, Inputs};
use attnc_compiler::plan::{self, BufferRole};
use attnc_runtime::gpu::exec::{Gpu, Handle};
use attnc_runtime::{bind, dtype};
use burn::backend::DispatchDevice;
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Device, DeviceKind, Tensor, TensorData};
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).map(|a| a.parse().expect("a number")).collect();
    let (h, n, d, iters) = match args[..] {
        [h, n, d, i] => (h, n, d, i),
        _ => (8, 1024, 64, 5),
    };
    let source = format!(
        "spec causal\ninput q: [1, {h}, {n}, {d}]\ninput k: [1, {h}, {n}, {d}]\ninput v: [1, {h}, {n}, {d}]\n\
         output o = attention(q, k, v, mask = causal)\n"
    );
    let op = AttncOp::compile("causal.attn", &source, &[]).unwrap_or_else(|e| panic!("{e}"));
    let program = op.program().clone();
    let (tensors, dims) = bind::generate_inputs(&program, 0).unwrap();
    let device = Device::wgpu(DeviceKind::DefaultDevice).autodiff();
    let burn = |t: &attnc_runtime::Tensor| {
        let data: Vec<f32> = t.data.iter().map(|&x| x as f32).collect();
        Tensor::<4>::from_data(TensorData::new(data, t.shape.clone()), &device)
    };
    let (q, k, v) = (burn(&tensors[0]), burn(&tensors[1]), burn(&tensors[2]));
    let cot = burn(&tensors[0]);

    // attnc directly: the gradient program's halves on Burn's client.
    let DispatchDevice::Cube(cube) = device.as_dispatch().clone().inner() else { panic!("a cubecl device") };
    let gpu = Gpu::with_client(cube.client(), "wgpu", false);
    let grad = attnc_compiler::grad::differentiate(&program, &[]).unwrap();
    let split = attnc_compiler::grad::split(&grad, 3, 1);
    let (fwd, bwd) = (plan::plan(&split.forward, &dims), plan::plan(&split.backward, &dims));
    let upload = |t: &attnc_runtime::Tensor| gpu.client().create_from_slice(&dtype::encode(fwd.dtype, &t.data));
    let given: Vec<(String, Handle)> = (program.inputs.iter().map(|i| i.name.clone()))
        .chain(["cot_o".to_string()])
        .zip(tensors.iter().chain([&tensors[0]]).map(upload))
        .collect();
    let direct = || {
        let bind = |plan: &plan::Plan, handles: &mut Vec<Option<Handle>>| {
            for b in &plan.buffers {
                if let BufferRole::Input { name, .. } = &b.role {
                    handles[b.id] = given.iter().find(|(n, _)| n == name).map(|(_, h)| h.clone());
                }
            }
        };
        let mut f = vec![None; fwd.buffers.len()];
        bind(&fwd, &mut f);
        gpu.run_resident(&fwd, &mut f).unwrap();
        let mut b = vec![None; bwd.buffers.len()];
        bind(&bwd, &mut b);
        for (name, id) in &fwd.outputs {
            let at = bwd.buffers.iter().position(|x| matches!(&x.role, BufferRole::Input { name: m, .. } if m == name));
            if let Some(at) = at {
                b[at] = f[*id].clone();
            }
        }
        gpu.run_resident(&bwd, &mut b).unwrap();
        gpu.sync().unwrap();
    };
    // Through Burn: the op on tracked tensors, `Σ o · c` backward.
    let through_burn = || {
        let (q, k, v) = (q.clone().require_grad(), k.clone().require_grad(), v.clone().require_grad());
        let inputs = Inputs::new().with("q", q.clone()).with("k", k.clone()).with("v", v.clone());
        let o = op.forward(inputs).unwrap().take::<4>("o").unwrap();
        let grads = (o * cot.clone()).sum().backward();
        let _ = (q.grad(&grads), k.grad(&grads), v.grad(&grads));
        device.sync().unwrap();
    };
    let burns_own = || {
        let (q, k, v) = (q.clone().require_grad(), k.clone().require_grad(), v.clone().require_grad());
        let options = AttentionModuleOptions { scale: None, softcap: None, is_causal: true };
        let o = attention(q.clone(), k.clone(), v.clone(), None, None, options);
        let grads = (o * cot.clone()).sum().backward();
        let _ = (q.grad(&grads), k.grad(&grads), v.grad(&grads));
        device.sync().unwrap();
    };
    // Warm-up (kernels compiled), then alternately.
    for f in [&direct as &dyn Fn(), &through_burn, &burns_own] {
        f();
    }
    let mut times = [vec![], vec![], vec![]];
    for _ in 0..iters {
        for (t, f) in times.iter_mut().zip([&direct as &dyn Fn(), &through_burn, &burns_own]) {
            let start = Instant::now();
            f();
            t.push(start.elapsed().as_secs_f64());
        }
    }
    let [direct, through, own] = times.map(median);
    println!("causal attention, training step (forward and backward), H={h} N={n} d={d}, median of {iters}:");
    println!("  attnc directly (grad::split halves, run_resident): {:.1} ms", direct * 1e3);
    println!("  attnc through Burn (attnc-burn, autodiff):          {:.1} ms", through * 1e3);
    println!("  Burn's own attention (cubek-attention, autodiff):   {:.1} ms", own * 1e3);
    println!(
        "attnc-burn / attnc time ratio {:.3}; Burn's attention / attnc-burn {:.3}",
        through / direct,
        own / through
    );
}
