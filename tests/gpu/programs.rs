//! Precompiled WGSL, and the ordinal estimator's level decompositions.

use super::*;
use attnc_runtime::gpu::exec::Handle;

/// WGSL written by `attnc compile`, launched as precompiled source, gives
/// exactly what the in-process definitions give.
pub(crate) fn precompiled_wgsl_matches(make: Make, dtype: Dtype) {
    let c = compile_stdlib("iha", &sets(&[("H", "2"), ("P", "3"), ("d", "4"), ("N", "19"), ("rope", "100.0")]));
    let inputs = seeded(&c, 5);
    let dims = bind::default_dims(&c.program).unwrap();
    let p = plan::plan(&c.program, &dims).in_dtype(dtype);
    let (files, manifest) = emit::emit(&p, emit::Target::Wgsl).unwrap();
    let sources: BTreeMap<String, String> =
        manifest.launches.iter().zip(&files).map(|(l, (_, text))| (l.entry.clone(), text.clone())).collect();
    let (direct, _) = device(make, dtype).run(&p, &inputs).unwrap();
    let (loaded, _) = device(make, dtype).map(|g| g.with_precompiled(sources)).run(&p, &inputs).unwrap();
    assert_eq!(direct, loaded, "precompiled WGSL differs from the in-process kernels");
}

/// A random decomposition over rating levels, like ODRPO's: statistics of
/// `thresholds(r)` over the group, an elementwise function of them, and
/// reductions over the levels and the group. The group kernels keep such
/// values lifted (two rows per level, O(G + K)) where they can and densify
/// where they cannot (a sample-dependent `z`, `std` over the levels). A
/// random per-sample term, added last (a leave-one-out mean of it would
/// shrink it by the group size), keeps the output away from exact
/// cancellations (`Σ_g (t − p) = 0`), where a relative error measures f32
/// rounding only.
#[derive(Clone, Debug)]
pub(crate) struct Decomp {
    pub(crate) k: usize,
    pub(crate) b: usize,
    pub(crate) g: usize,
    pub(crate) stat: &'static str,
    pub(crate) expr: usize,
    pub(crate) red: &'static str,
    pub(crate) stat2: &'static str,
    pub(crate) loo: bool,
    pub(crate) seed: u64,
}

pub(crate) fn decomp() -> impl Strategy<Value = Decomp> {
    let stats = vec!["mean", "sum", "max", "min", "count", "std", "var"];
    (
        2..=40usize,
        1..=5usize,
        1..=70usize,
        prop::sample::select(stats.clone()),
        0..5usize,
        prop::sample::select(vec!["sum", "mean", "max", "min", "count", "std"]),
        prop::sample::select(stats),
        any::<bool>(),
        any::<u64>(),
    )
        .prop_map(|(k, b, g, stat, expr, red, stat2, loo, seed)| Decomp {
            k,
            b,
            g,
            stat,
            expr,
            red,
            stat2,
            loo,
            seed,
        })
}

/// Cases that failed once, kept as they were drawn.
/// - A group statistic broadcast to every sample (`y0`) carries one rounding
///   of the inputs, amplified by the group sum, into all 65 outputs: the
///   half precision rule held it against a reference that also rounded
///   where the kernel keeps f32, whose roundings cancelled by chance.
pub(crate) fn found_decompositions() -> Vec<Decomp> {
    vec![Decomp {
        k: 10,
        b: 1,
        g: 65,
        stat: "var",
        expr: 2,
        red: "count",
        stat2: "sum",
        loo: true,
        seed: 12317138568026621613,
    }]
}

pub(crate) fn decomposition(gpu: &Dev, d: &Decomp) {
    let expr = [
        "(t - p) / (s + 1)",
        "where(t > 0, s, p)",
        "t * s + p * w",
        "maximum(t, p) - minimum(t, s)",
        "(t - p) * z", // varies with the sample: densified
    ][d.expr];
    let y = if d.loo && d.g >= 2 { "loo_mean(y0, axis = 1)" } else { "y0" };
    let source = format!(
        "spec decomp\nparam K: int = {k}\ndim B = {b}\ndim G = {g}\n\
         input r: [B, G] in integers(1, K)\ninput z: [B, G, 1]\ninput w: [{l}]\n\
         let t = thresholds(r, levels = K)\nlet p = mean(t, axis = 1)\nlet s = {stat}(t, axis = 1)\n\
         let e = {expr}\nlet red = {red}(e, axis = 2, keepdim = false)\nlet q = {stat2}(e, axis = 1)\n\
         let y0 = red + sum(q, axis = 2, keepdim = false)\noutput y = {y} + sum(z, axis = 2, keepdim = false)\n",
        k = d.k,
        l = d.k - 1,
        b = d.b,
        g = d.g,
        stat = d.stat,
        red = d.red,
        stat2 = d.stat2,
    );
    let c = attnc_compiler::compile(&source, &[])
        .unwrap_or_else(|e| panic!("{}", attnc_compiler::render("decomp", &source, &e)));
    let inputs = seeded(&c, d.seed);
    check_spec(gpu, &c, &inputs, false, &format!("{d:?}"));
}

#[test]
pub(crate) fn precompiled_wgsl_runs_like_the_in_process_kernels() {
    precompiled_wgsl_matches(wgpu, Dtype::F32);
    precompiled_wgsl_matches(wgpu, Dtype::F16);
}

/// A device of its own (`Gpu::wgpu_own_device`, what every test here runs
/// on through `common::wgpu`) is the shared device's adapter, with its
/// plane width and types, and runs a plan to the same bits.
#[test]
pub(crate) fn own_devices_are_the_shared_devices_adapter() {
    let shared = Gpu::wgpu().unwrap_or_else(|e| panic!("this test needs a device and found none: {e}"));
    let own = Gpu::wgpu_own_device().unwrap_or_else(|e| panic!("this test needs a device and found none: {e}"));
    assert_eq!(own.adapter, shared.adapter);
    let plane = |g: &Gpu| attnc_runtime::gpu::device::plane_width(g.client().properties());
    assert_eq!(plane(&own), plane(&shared), "plane width");
    for dtype in [Dtype::F32, Dtype::F16, Dtype::Bf16, Dtype::Tf32] {
        assert_eq!(own.supports(dtype).is_ok(), shared.supports(dtype).is_ok(), "{dtype}");
    }
    let c = compile_stdlib("iha", &sets(&[("H", "2"), ("P", "3"), ("d", "8"), ("N", "70"), ("rope", "100.0")]));
    let inputs = seeded(&c, 4);
    let p = plan_in(Dtype::F32, &c.program, &bind::default_dims(&c.program).unwrap());
    let (a, _) = own.run(&p, &inputs).unwrap();
    let (b, _) = shared.run(&p, &inputs).unwrap();
    assert!(a[0].data.iter().any(|v| *v != 0.0), "all zeros");
    assert_eq!(a, b, "the same plan on the two devices");
}

/// A gradient program cut for training (`grad::split`) run on
/// device-resident buffers (`Gpu::run_resident`, what `attnc-burn`'s
/// autodiff does): the forward half's outputs and residuals stay on the
/// device, the backward half reads them there with the cotangents, and its
/// gradients equal the interpreter's gradient program's, for IHA and a
/// score function; a buffer the backward needs and was not given is a
/// named error.
#[test]
pub(crate) fn training_halves_run_on_resident_buffers() {
    let gpu = needs_wgpu();
    for (spec, sets) in [
        ("iha", sets(&[("H", "4"), ("P", "2"), ("N", "300"), ("d", "32")])),
        ("alibi", sets(&[("H", "4"), ("N", "200"), ("d", "32")])),
    ] {
        let compiled = compile_stdlib(spec, &sets);
        let grad = attnc_compiler::grad::differentiate(&compiled.program, &[]).unwrap();
        let (tensors, dims) = bind::generate_inputs(&grad, 5).unwrap();
        let want = interp::evaluate(&grad, &tensors, &dims);
        let outputs = compiled.program.outputs.len();
        let split = attnc_compiler::grad::split(&grad, compiled.program.inputs.len(), outputs);
        let (fwd, bwd) = (plan::plan(&split.forward, &dims), plan::plan(&split.backward, &dims));
        assert!(!split.saved.is_empty(), "{spec}: nothing saved");
        let upload = |plan: &Plan, handles: &mut Vec<Option<Handle>>, skip: &dyn Fn(&str) -> bool| {
            for b in &plan.buffers {
                if let plan::BufferRole::Input { name, .. } = &b.role {
                    if let Some(i) = grad.inputs.iter().position(|x| &x.name == name).filter(|_| !skip(name)) {
                        let bytes = attnc_runtime::dtype::encode(plan.dtype, &tensors[i].data);
                        handles[b.id] = Some(gpu.client().create_from_slice(&bytes));
                    }
                }
            }
        };
        let mut f: Vec<Option<Handle>> = vec![None; fwd.buffers.len()];
        upload(&fwd, &mut f, &|_| false);
        gpu.run_resident(&fwd, &mut f).unwrap();
        let mut b: Vec<Option<Handle>> = vec![None; bwd.buffers.len()];
        upload(&bwd, &mut b, &|name| split.saved.iter().any(|s| s == name));
        let grads: Vec<usize> = bwd.outputs.iter().map(|(_, id)| *id).collect();
        // The residuals not handed over yet: a named error, nothing run.
        let err = gpu.run_resident(&bwd, &mut b.clone()).unwrap_err();
        assert!(split.saved.iter().any(|s| err.to_string().contains(s.as_str())), "{spec}: {err}");
        for (name, id) in &fwd.outputs {
            if let Some(at) =
                bwd.buffers.iter().position(|x| matches!(&x.role, plan::BufferRole::Input { name: n, .. } if n == name))
            {
                b[at] = f[*id].clone();
            }
        }
        gpu.run_resident(&bwd, &mut b).unwrap();
        let read = gpu.client().read(grads.iter().map(|&id| b[id].clone().unwrap()).collect()).unwrap();
        for ((name, _), bytes) in bwd.outputs.iter().zip(read) {
            let at = grad.outputs.iter().position(|(n, _)| n == name).unwrap();
            let got = attnc_runtime::dtype::decode(bwd.dtype, &bytes);
            assert!(want[at].data.iter().any(|x| *x != 0.0), "{spec}: {name} is zero");
            check_close(Dtype::F32, &got, &want[at].data, None, &format!("{spec} {name} from resident halves"));
        }
    }
}
