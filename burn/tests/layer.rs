//! `AttncLayer`: a spec's weights as Burn parameters drawn from the spec's
//! own distributions, run on wgpu against the interpreter, saved and
//! loaded with the module's record, and trained by Burn's Adam.

use attnc_burn::{AttncLayer, AttncOp, Inputs};
use attnc_compiler::ir::DimValues;
use attnc_runtime::{bind, interp, relative_error};
use burn::module::Module;
use burn::optim::{AdamConfig, GradientsParams};
use burn::tensor::{Device, DeviceKind, Tensor, TensorData};

fn iha() -> AttncOp {
    let path = format!("{}/../stdlib/iha.attn", env!("CARGO_MANIFEST_DIR"));
    AttncOp::from_file(path, &[("H", "2"), ("P", "2"), ("d", "8"), ("N", "40")]).unwrap_or_else(|e| panic!("{e}"))
}

fn x_of(t: &attnc_runtime::Tensor, device: &Device) -> Tensor<3> {
    let data: Vec<f32> = t.data.iter().map(|&v| v as f32).collect();
    Tensor::from_data(TensorData::new(data, t.shape.clone()), device)
}

/// IHA's inputs drawn with `seed` (`x` first) and its dims, a layer of
/// its weights drawn with the same seed on `device`, and `x` there.
fn drawn(seed: u64, device: &Device) -> (AttncLayer, Vec<attnc_runtime::Tensor>, DimValues, Tensor<3>) {
    let op = iha();
    let (tensors, dims) = bind::generate_inputs(op.program(), seed).unwrap();
    assert_eq!(op.program().inputs[0].name, "x");
    let x = x_of(&tensors[0], device);
    (AttncLayer::new(op, seed, device).unwrap(), tensors, dims, x)
}

/// The layer's output `y` on `x`.
fn y_of(layer: &AttncLayer, x: &Tensor<3>) -> Tensor<3> {
    layer.forward(Inputs::new().with("x", x.clone())).unwrap().take::<3>("y").unwrap()
}

fn values(t: Tensor<3>) -> Vec<f64> {
    t.into_data().try_to_vec::<f32>().unwrap().into_iter().map(f64::from).collect()
}

/// The layer's weights are the spec's draws at seed `s` (`attnc run
/// --seed s` draws the same), so its output on `x` is the interpreter's
/// on those inputs; saved and loaded into a layer drawn at another seed,
/// it gives the same output again.
#[test]
fn a_layer_draws_the_specs_weights_and_round_trips_its_record() {
    let device = Device::wgpu(DeviceKind::DefaultDevice);
    let (layer, tensors, dims, x) = drawn(7, &device);
    let op = layer.op().clone();
    let program = op.program().clone();
    let want = interp::evaluate(&program, &tensors, &dims).remove(0);
    let weights = program.inputs.iter().zip(&tensors).filter(|(i, _)| i.weight).map(|(_, t)| t.data.len());
    assert_eq!(layer.num_params(), weights.sum::<usize>());
    let y = |layer: &AttncLayer| values(y_of(layer, &x));
    let got = y(&layer);
    let e = relative_error(&got, &want.data);
    assert!(e <= 1e-4 && want.data.iter().any(|v| *v != 0.0), "relative error {e:e}");
    let file = std::env::temp_dir().join(format!("attnc-burn-layer-{}.bpk", std::process::id()));
    layer.clone().save_file(&file).unwrap();
    let other = AttncLayer::new(op, 8, &device).unwrap();
    assert!(relative_error(&y(&other), &got) > 1e-2, "seeds 7 and 8 draw the same weights");
    // (Burn reads the file lazily: it stays until the weights are used.)
    let loaded = other.load_file(&file);
    let again = y(&loaded);
    let _ = std::fs::remove_file(&file);
    assert_eq!(again, got);
}

/// Adam steps on the layer's parameters through attnc's gradient program:
/// every weight gets a gradient, and a loss that has a minimum falls.
#[test]
fn adam_trains_a_layer() {
    let device = Device::wgpu(DeviceKind::DefaultDevice).autodiff();
    let (mut layer, tensors, _, x) = drawn(3, &device);
    // Fit the output to a fixed target: the squared error falls.
    let target = x_of(&tensors[0], &device) * 0.5;
    let mut opt = AdamConfig::new().init();
    let mut losses = vec![];
    for _ in 0..8 {
        let loss = (y_of(&layer, &x) - target.clone()).powi_scalar(2).mean();
        losses.push(f64::from(loss.clone().into_data().try_to_vec::<f32>().unwrap()[0]));
        let grads = loss.backward();
        let grads = GradientsParams::from_grads(grads, &layer);
        // w_q, w_k, w_v, w_o, the pseudo-head mixing α_q, α_k, α_v and the collapse r.
        assert_eq!(grads.len(), 8, "a gradient for each weight");
        layer = opt.step(1e-2, layer, grads);
    }
    eprintln!("losses: {losses:?}");
    assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
    assert!(losses[7] < 0.9 * losses[0], "the loss did not fall: {losses:?}");
}

/// A training step reads nothing back to the host. Checked two ways:
/// attnc's executors count every buffer they read back
/// (`exec::HOST_READS`; `Gpu::run` reads its outputs, and this test makes
/// one such read to show the count moves), and the count does not move
/// over two forward, backward and Adam steps; and attnc-burn's source has
/// no call that reads a Burn tensor or a cubecl buffer to the host.
#[test]
fn a_training_step_reads_nothing_back() {
    use attnc_runtime::gpu::exec::HOST_READS;
    use std::sync::atomic::Ordering;
    let device = Device::wgpu(DeviceKind::DefaultDevice).autodiff();
    let (mut layer, tensors, dims, x) = drawn(4, &device);
    let program = layer.op().program().clone();
    let mut opt = AdamConfig::new().init();
    let before = HOST_READS.load(Ordering::SeqCst);
    for _ in 0..2 {
        let grads = GradientsParams::from_grads(y_of(&layer, &x).powi_scalar(2).mean().backward(), &layer);
        layer = opt.step(1e-2, layer, grads);
    }
    device.sync().unwrap();
    assert_eq!(HOST_READS.load(Ordering::SeqCst), before, "attnc read a buffer back during training");
    // The count moves on a read: attnc's own host run of the same spec.
    let gpu = attnc_runtime::gpu::exec::Gpu::wgpu().unwrap();
    let named = program.inputs.iter().map(|i| i.name.clone()).zip(tensors).collect();
    gpu.run(&attnc_compiler::plan::plan(&program, &dims), &named).unwrap();
    assert!(HOST_READS.load(Ordering::SeqCst) > before, "the count does not see a read");
    // No host read in attnc-burn's source.
    for file in ["backend.rs", "op.rs", "layer.rs", "error.rs", "lib.rs"] {
        let text = std::fs::read_to_string(format!("{}/src/{file}", env!("CARGO_MANIFEST_DIR"))).unwrap();
        for call in ["into_data", "to_data", ".read(", "read_one", "into_scalar"] {
            assert!(!text.contains(call), "burn/src/{file} calls `{call}`");
        }
    }
}
