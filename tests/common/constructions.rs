//! The IHA paper's constructions (arXiv 2602.21371; docs/semantics.md §10),
//! each a spec with the weights its proof sets and the closed form of its
//! output: shared by `tests/theorems.rs` and `examples/iha_theorems.rs`.

use crate::common::*;
use attnc_runtime::rng::Rng;
use attnc_runtime::{bind, Tensor};
use std::collections::BTreeMap;

/// One construction: a spec, its inputs, the closed form of its output.
pub struct Construction {
    pub what: String,
    pub spec: attnc_compiler::Compiled,
    pub inputs: BTreeMap<String, Tensor>,
    pub want: Tensor,
}

pub fn compile(what: &str, source: &str) -> attnc_compiler::Compiled {
    attnc_compiler::compile(source, &[])
        .unwrap_or_else(|e| panic!("{what}:\n{}", attnc_compiler::render(what, source, &e)))
}

/// A tensor from a function of its index.
fn tensor(shape: &[usize], f: impl Fn(&[usize]) -> f64) -> Tensor {
    let n: usize = shape.iter().product();
    let data = (0..n)
        .map(|mut flat| {
            let mut at = vec![0; shape.len()];
            for (a, s) in at.iter_mut().zip(shape).rev() {
                *a = flat % s;
                flat /= s;
            }
            f(&at)
        })
        .collect();
    Tensor::new(shape.to_vec(), data)
}

/// An n × n matrix product.
fn matmul(a: &[f64], b: &[f64], n: usize) -> Vec<f64> {
    (0..n * n).map(|x| (0..n).map(|c| a[x / n * n + c] * b[c * n + x % n]).sum()).collect()
}

/// `a`'s powers 0..count, each n × n.
fn powers(a: &[f64], n: usize, count: usize) -> Vec<Vec<f64>> {
    let mut out = vec![(0..n * n).map(|x| f64::from(u8::from(x / n == x % n))).collect::<Vec<f64>>()];
    while out.len() < count {
        out.push(matmul(out.last().unwrap(), a, n));
    }
    out
}

/// The single-layer construction both tasks share (App. B.2, B.3): H = P
/// heads over X̂ = [X, I_N] (dx feature columns, then N positional ones).
/// Head m's queries are the matrix `left[m]` (W_Q reads the positional
/// part), its keys `right[m]`ᵀ, its values X in channel block m; pseudo j
/// of every head copies head j (α[m, h, j] = 1[m = j]), so pseudo-query
/// (n, j) scores pseudo-key (m, j') by (left[j] · right[j'])[n, m]; the
/// collapse keeps pseudo h of head h, times `gain`. Head h's output block
/// j' is then `weights` over row n of left[h]·right[j'] applied to X.
fn iha_layer(weights: &str, p: usize, x: &Tensor, left: &[Vec<f64>], right: &[Vec<f64>], gain: f64) -> Construction {
    let (n, dx) = (x.shape[1], x.shape[2]);
    let (h, w) = (p, dx + n);
    let source = format!(
        "spec iha_construction\n\
         input xh: [1, {n}, {w}]\n\
         input w_q: [{w}, {hn}]\ninput w_k: [{w}, {hn}]\ninput w_v: [{w}, {hv}]\n\
         input alpha_q: [{h}, {h}, {p}]\ninput alpha_k: [{h}, {h}, {p}]\ninput alpha_v: [{h}, {h}, {p}]\n\
         input r: [{h}, {hp}]\n\
         let q = split_heads(xh @ w_q, {h})\nlet k = split_heads(xh @ w_k, {h})\nlet v = split_heads(xh @ w_v, {h})\n\
         let qt = interleave(mix_heads(q, alpha_q))\nlet kt = interleave(mix_heads(k, alpha_k))\n\
         let vt = interleave(mix_heads(v, alpha_v))\n\
         let ot = attention(qt, kt, vt, mask = none, weights = {weights}, scale = 1.0)\n\
         output y = merge_heads(collapse(deinterleave(ot, {p}), r, mode = global))\n",
        hn = h * n,
        hv = h * p * dx,
        hp = h * p,
    );
    let xh =
        tensor(
            &[1, n, w],
            |a| if a[2] < dx { x.data[a[1] * dx + a[2]] } else { f64::from(u8::from(a[2] - dx == a[1])) },
        );
    // W_Q[dx + i, m·n + c] = left[m][i, c]: Q_m = left[m].
    let w_q = tensor(&[w, h * n], |a| if a[0] < dx { 0.0 } else { left[a[1] / n][(a[0] - dx) * n + a[1] % n] });
    // W_K[dx + i, m·n + c] = right[m][c, i]: K_m = right[m]ᵀ.
    let w_k = tensor(&[w, h * n], |a| if a[0] < dx { 0.0 } else { right[a[1] / n][(a[1] % n) * n + a[0] - dx] });
    // W_V[c, m·(p·dx) + m·dx + c] = 1: V_m is X in block m.
    let w_v = tensor(&[w, h * p * dx], |a| {
        let (m, rest) = (a[1] / (p * dx), a[1] % (p * dx));
        f64::from(u8::from(a[0] < dx && rest == m * dx + a[0]))
    });
    let copy = tensor(&[h, h, p], |a| f64::from(u8::from(a[0] == a[2])));
    let r = tensor(&[h, h * p], |a| if a[1] == a[0] * p + a[0] { gain } else { 0.0 });
    let spec = compile(&format!("{weights} construction"), &source);
    let inputs = named(vec![
        ("xh", xh),
        ("w_q", w_q),
        ("w_k", w_k),
        ("w_v", w_v),
        ("alpha_q", copy.clone()),
        ("alpha_k", copy.clone()),
        ("alpha_v", copy),
        ("r", r),
    ]);
    let want = Tensor::new(vec![0], vec![]);
    Construction { what: String::new(), spec, inputs, want }
}

/// The Polynomial task for `k`: A a random N × N matrix, left[m] = A^(mP),
/// right[j'] = A^(j'); the output's block hP + j' is A^(hP + j') X.
fn polynomial(k: usize, seed: u64) -> Construction {
    let p = (k as f64).sqrt().ceil() as usize;
    let (n, dx) = (7, 3);
    let mut rng = Rng::for_input(seed, "polynomial");
    // Entries of size 1/√N: powers up to the 8th stay of order 1.
    let a: Vec<f64> = random(&mut rng, &[n, n]).data.iter().map(|v| v * 1.5 / (n as f64).sqrt()).collect();
    let x = random(&mut rng, &[1, n, dx]);
    let pw = powers(&a, n, p * p);
    let left: Vec<Vec<f64>> = (0..p).map(|m| pw[m * p].clone()).collect();
    let mut c = iha_layer("linear", p, &x, &left, &pw[..p], 1.0);
    // y[n, t·dx + c] = (A^t X)[n, c] for t < P².
    c.want = tensor(&[1, n, p * p * dx], |at| {
        let t = at[2] / dx;
        (0..n).map(|m| pw[t][at[1] * n + m] * x.data[m * dx + at[2] % dx]).sum()
    });
    c.what = format!("Polynomial task k = {k} (H = P = {p}, linear attention)");
    assert!(p * p >= k);
    c
}

/// The cyclic shift S^t: (S^t X)[n] = X[(n − t) mod N].
fn shift(t: usize, n: usize) -> Vec<f64> {
    (0..n * n).map(|x| f64::from(u8::from(x % n == (x / n + n * n - t) % n))).collect()
}

/// CPM-3's workspace for `n_max`: left[m] = S^(mP), right[j'] = S^(j');
/// each pseudo-query's maximal scores are P ties (one per pseudo-key
/// block), hard attention averages them, and the collapse's gain P
/// undoes the average: block hP + j' is X shifted by hP + j'.
fn cpm(n_max: usize, seed: u64) -> (Construction, Construction) {
    let p = (n_max as f64).sqrt().ceil() as usize;
    // Three features a token. (With two, ptxas spills 4 bytes in the
    // MHA side's hard-attention kernel, 16 heads of width 16: noted in
    // issue 50.)
    let (n, dx) = (n_max, 3);
    let mut rng = Rng::for_input(seed, "cpm");
    let x = random(&mut rng, &[1, n, dx]);
    let left: Vec<Vec<f64>> = (0..p).map(|m| shift(m * p, n)).collect();
    let right: Vec<Vec<f64>> = (0..p).map(|j| shift(j, n)).collect();
    let mut iha = iha_layer("hard", p, &x, &left, &right, p as f64);
    let shifted =
        |blocks: usize| tensor(&[1, n, blocks * dx], |at| x.data[((at[1] + n * n - at[2] / dx) % n) * dx + at[2] % dx]);
    iha.want = shifted(p * p);
    iha.what = format!("CPM-3 N_max = {n_max}: IHA, H = P = {p}, hard attention");
    // MHA needs a head per shift: head t's queries S^t, keys I, values X.
    let w = dx + n;
    let source = format!(
        "spec mha_shifts\ninput xh: [1, {n}, {w}]\ninput w_q: [{w}, {hn}]\ninput w_k: [{w}, {hn}]\ninput w_v: [{w}, {hv}]\n\
         let q = split_heads(xh @ w_q, {n})\nlet k = split_heads(xh @ w_k, {n})\nlet v = split_heads(xh @ w_v, {n})\n\
         output y = merge_heads(attention(q, k, v, mask = none, weights = hard, scale = 1.0))\n",
        hn = n * n,
        hv = n * dx,
    );
    let mut inputs = iha.inputs.clone();
    inputs.retain(|k, _| k == "xh");
    let shifts: Vec<Vec<f64>> = (0..n).map(|t| shift(t, n)).collect();
    inputs.insert(
        "w_q".into(),
        tensor(&[w, n * n], |a| if a[0] < dx { 0.0 } else { shifts[a[1] / n][(a[0] - dx) * n + a[1] % n] }),
    );
    inputs.insert("w_k".into(), tensor(&[w, n * n], |a| f64::from(u8::from(a[0] >= dx && a[0] - dx == a[1] % n))));
    inputs.insert("w_v".into(), tensor(&[w, n * dx], |a| f64::from(u8::from(a[0] < dx && a[0] == a[1] % dx))));
    let mha = Construction {
        what: format!("CPM-3 N_max = {n_max}: MHA, {n_max} heads"),
        spec: compile("mha shifts", &source),
        inputs,
        want: shifted(n),
    };
    (iha, mha)
}

/// Strictness (App. A): one head, P = 2, every token the same. Pseudo-key
/// 1 is −k and pseudo-value 1 is −v, so each pseudo-query's softmax over
/// scores ±s weighs v and −v: the output is v·tanh(s), s = q·k/√d, while
/// MHA on the same tokens outputs v for every s. (The paper prints
/// α^V[·,·,2] = +1, which gives v: −1 gives the tanh.)
fn strictness(seed: u64) -> Construction {
    let (n, d) = (5, 4);
    let mut rng = Rng::for_input(seed, "strictness");
    let token = |rng: &mut Rng| random(rng, &[d]).data;
    let (q, k, v) = (token(&mut rng), token(&mut rng), token(&mut rng));
    let repeat = |t: &[f64]| tensor(&[1, 1, n, d], |a| t[a[3]]);
    let source = "spec strict\ninput q: [1, 1, 5, 4]\ninput k: [1, 1, 5, 4]\ninput v: [1, 1, 5, 4]\n\
         input alpha_q: [1, 1, 2]\ninput alpha_k: [1, 1, 2]\ninput alpha_v: [1, 1, 2]\ninput r: [1, 2]\n\
         let ot = attention(interleave(mix_heads(q, alpha_q)), interleave(mix_heads(k, alpha_k)), \
         interleave(mix_heads(v, alpha_v)), mask = none)\n\
         output o = collapse(deinterleave(ot, 2), r, mode = global)\n";
    // Scores of a few units: tanh far from linear.
    let q: Vec<f64> = q.iter().map(|v| v * 3.0).collect();
    let s = q.iter().zip(&k).map(|(a, b)| a * b).sum::<f64>() / (d as f64).sqrt();
    let inputs = named(vec![
        ("q", repeat(&q)),
        ("k", repeat(&k)),
        ("v", repeat(&v)),
        ("alpha_q", Tensor::new(vec![1, 1, 2], vec![1.0, 1.0])),
        ("alpha_k", Tensor::new(vec![1, 1, 2], vec![1.0, -1.0])),
        ("alpha_v", Tensor::new(vec![1, 1, 2], vec![1.0, -1.0])),
        // Pseudo-output 0.
        ("r", Tensor::new(vec![1, 2], vec![1.0, 0.0])),
    ]);
    let want = tensor(&[1, 1, n, d], |a| v[a[3]] * s.tanh());
    Construction {
        what: format!("strictness: v·tanh(s), s = {s:.3}"),
        spec: compile("strictness", source),
        inputs,
        want,
    }
}

/// Inclusion (§2): α[m, h, j] = 1[m = h] and r selecting pseudo P − 1 of
/// each head under `flat_causal` is MHA, causal.
fn inclusion(seed: u64) -> Construction {
    let (h, p, d, n) = (3, 3, 4, 11);
    let s = |pairs: &[(&'static str, String)]| pairs.to_vec();
    let iha = compile_stdlib(
        "iha",
        &s(&[("H", h.to_string()), ("P", p.to_string()), ("d", d.to_string()), ("mask", "flat_causal".into())]),
    );
    let mha = compile_stdlib("mha", &s(&[("H", h.to_string()), ("d", d.to_string()), ("mask", "causal".into())]));
    let (tensors, _) = bind::generate_inputs(&iha.program, seed).unwrap();
    let mut inputs: BTreeMap<String, Tensor> = iha.program.inputs.iter().map(|i| i.name.clone()).zip(tensors).collect();
    let x = random(&mut Rng::for_input(seed, "x"), &[1, n, h * d]);
    inputs.insert("x".into(), x);
    let one_hot = tensor(&[h, h, p], |a| f64::from(u8::from(a[0] == a[1])));
    for name in ["alpha_q", "alpha_k", "alpha_v"] {
        inputs.insert(name.into(), one_hot.clone());
    }
    inputs.insert("r".into(), tensor(&[h, h * p], |a| f64::from(u8::from(a[1] == a[0] * p + p - 1))));
    let mut mha_inputs = inputs.clone();
    mha_inputs.retain(|k, _| ["x", "w_q", "w_k", "w_v", "w_o"].contains(&k.as_str()));
    let want = eval(&mha, &mha_inputs).remove("y").unwrap();
    Construction {
        what: format!("inclusion: one-hot IHA (H = {h}, P = {p}, flat_causal) is MHA"),
        spec: iha,
        inputs,
        want,
    }
}

pub fn constructions() -> Vec<Construction> {
    let (cpm9, mha9) = cpm(9, 3);
    let (cpm16, mha16) = cpm(16, 4);
    vec![inclusion(1), strictness(2), polynomial(4, 5), polynomial(9, 6), cpm9, mha9, cpm16, mha16]
}
