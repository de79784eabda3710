//! `attnc bench`: the gradient program's times, plain attention of the
//! same sizes beside head mixing and the weightings, inputs from a file.

use super::*;

/// The seconds a bench row's median column gives (`1.053 s`, `72.066 ms`, `893.984 µs`).
fn seconds(value: &str, unit: &str) -> f64 {
    let v: f64 = value.parse().unwrap_or_else(|_| panic!("`{value}` is not a number"));
    v * match unit {
        "s" => 1.0,
        "ms" => 1e-3,
        "µs" => 1e-6,
        "ns" => 1e-9,
        other => panic!("unknown unit `{other}`"),
    }
}

#[test]
fn bench_times_the_gradient_program() {
    let args = ["bench", "stdlib/mha.attn", "--set", "N=40", "--set", "H=2", "--set", "d=8"];
    let run = |extra: &[&str]| {
        let o = attnc(&[&args[..], &["--iters", "1", "--warmup", "1"], extra].concat());
        assert!(o.status.success(), "{}", stderr(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let backward = ["attention_grad_q", "attention_grad_kv"];
    let forward = run(&[]);
    assert!(forward.contains("_attention "), "{forward}");
    assert!(backward.iter().all(|k| !forward.contains(k)), "{forward}");
    let step = run(&["--grad"]);
    for kind in backward {
        // kernel, median (value, unit), GFLOP, MB, roofline, of roof
        let row = step.lines().find(|l| l.split_whitespace().next().is_some_and(|n| n.ends_with(kind)));
        let cols: Vec<&str> = row.unwrap_or_else(|| panic!("no {kind} row in\n{step}")).split_whitespace().collect();
        let t = seconds(cols[1], cols[2]);
        let (gflop, mb): (f64, f64) = (cols[3].parse().unwrap(), cols[4].parse().unwrap());
        assert!(t.is_finite() && t > 0.0, "{kind}: {t}");
        assert!(gflop > 0.0 && mb > 0.0, "{kind}: {gflop} GFLOP, {mb} MB");
    }
    // The forward's own attention launch is part of the step, and so is its baseline.
    assert!(step.contains("_attention ") && step.contains("all kernels per call"), "{step}");
    // The ratio line is the backward's kernels over the forward's, from the rows above.
    let time_of = |kind: &str| -> f64 {
        step.lines()
            .filter(|l| l.split_whitespace().next().is_some_and(|n| n.ends_with(&format!("_{kind}"))))
            .map(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                seconds(cols[1], cols[2])
            })
            .sum()
    };
    let line = step.lines().find(|l| l.starts_with("backward/forward attention time ratio "));
    let line = line.unwrap_or_else(|| panic!("no ratio line in\n{step}"));
    let r: f64 = line.split_whitespace().nth(4).unwrap().parse().unwrap();
    let want = backward.iter().map(|k| time_of(k)).sum::<f64>() / time_of("attention");
    assert!(r.is_finite() && (r - want).abs() <= 0.02 * want + 0.01, "{line}: want {want:.3}");
    assert!(!forward.contains("backward/forward"), "{forward}");
    let o = attnc(&[&args[..], &["--wrt", "x"]].concat());
    assert!(!o.status.success() && stderr(&o).contains("--grad"), "{}", stderr(&o));
}

/// The comparison `attnc bench` prints for a launch that computes
/// `beyond` plain attention: its header names the sizes, and the line
/// `<launch>: <t> <unit> against plain attention's <t> <unit>: <beyond>/plain attention time ratio <r>`
/// has a ratio that agrees with its two times, the launch's time its row's median.
fn check_plain_comparison(text: &str, header: &str, launch: &str, beyond: &str) {
    assert!(text.contains(header), "{text}");
    let line = text.lines().find(|l| l.contains("against plain attention's"));
    let line = line.unwrap_or_else(|| panic!("no comparison in\n{text}"));
    assert!(line.contains(&format!(": {beyond}/plain attention time ratio ")), "{line}");
    let cols: Vec<&str> = line.split_whitespace().collect();
    assert!(cols[0].ends_with(&format!("{launch}:")), "{text}");
    let (ours, plain) = (seconds(cols[1], cols[2]), seconds(cols[6], cols[7].trim_end_matches(':')));
    let r: f64 = cols.last().unwrap().parse().unwrap();
    assert!(ours > 0.0 && plain > 0.0 && ours.is_finite() && plain.is_finite(), "{line:?}");
    assert!((r - ours / plain).abs() <= 1e-3 * r + 2e-3, "{line:?}: want {:.3}", ours / plain);
    let row = text.lines().find(|l| l.split_whitespace().next() == Some(cols[0].trim_end_matches(':')));
    let row: Vec<&str> = row.unwrap_or_else(|| panic!("no row for {}", cols[0])).split_whitespace().collect();
    assert_eq!(seconds(row[1], row[2]), ours, "{text}");
}

/// Head mixing's bench times plain attention of the same sizes in the same
/// run (its own spec, compiled from the launch's shape) and prints the
/// ratio, which agrees with the two printed times; a spec without head
/// mixing prints none.
#[test]
fn bench_compares_head_mixing_with_plain_attention() {
    let args = ["bench", "stdlib/talking_heads.attn", "--set", "N=70", "--set", "H=2", "--set", "d=8"];
    let o = attnc(&[&args[..], &["--iters", "1", "--warmup", "1"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let what = "plain attention of the same sizes (B=1 H=2 H_kv=2 S=70 S_k=70 d=8 e=8, mask = causal; no mixing)";
    check_plain_comparison(&text, what, "_attention_mixed", "head mixing");
    let o = attnc(&["bench", "stdlib/mha.attn", "--set", "N=40", "--set", "H=2", "--set", "d=8", "--iters", "1"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success() && !text.contains("plain attention of"), "{o:?}");
    // Plain attention is timed against cubek-attention's too.
    assert!(text.contains("cubek-attention"), "{text}");
}

/// Attention weighted otherwise than by a softmax, or with a sink, is
/// timed against the plain softmax of the same sizes in the same run
/// (docs/semantics.md §9): gpt-oss's sink, sigmoid, linear and hard; not
/// against cubek-attention, whose weights are a softmax.
#[test]
fn bench_compares_weightings_with_the_softmax() {
    let o = attnc(&[
        "bench",
        "stdlib/gpt_oss.attn",
        "--set",
        "N=70",
        "--set",
        "H=4",
        "--set",
        "H_kv=2",
        "--set",
        "d=8",
        "--iters",
        "1",
        "--warmup",
        "1",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let what = "plain attention of the same sizes (B=1 H=4 H_kv=2 S=70 S_k=70 d=8 e=8, mask = causal, window = 128; \
                a softmax, no sink)";
    check_plain_comparison(&String::from_utf8_lossy(&o.stdout), what, "_attention", "sink");
    let dir = scratch("weightings");
    for weights in ["sigmoid", "linear", "hard"] {
        let spec = dir.join(format!("{weights}.attn"));
        let source = format!(
            "spec w\ninput q: [1, 2, 60, 8]\ninput k: [1, 2, 60, 8]\ninput v: [1, 2, 60, 8]\n\
             output o = attention(q, k, v, mask = none, weights = {weights})\n"
        );
        std::fs::write(&spec, source).unwrap();
        let o = attnc(&["bench", s(&spec), "--iters", "1", "--warmup", "1"]);
        assert!(o.status.success(), "{weights}: {}", stderr(&o));
        let what =
            "plain attention of the same sizes (B=1 H=2 H_kv=2 S=60 S_k=60 d=8 e=8, mask = none; a softmax, no sink)";
        let text = String::from_utf8_lossy(&o.stdout);
        check_plain_comparison(&text, what, "_attention", weights);
        // cubek-attention computes a softmax: no baseline for other weights.
        assert!(!text.contains("cubek-attention"), "{weights}: {text}");
    }
}

/// `bench --inputs` times the kernels on the tensors given (here the ones
/// `run --seed` drew), and a file that does not fit the spec is the same
/// named error as for `run`.
#[test]
fn bench_reads_its_inputs_from_a_file() {
    let dir = scratch("bench-inputs");
    let (drawn, out) = (dir.join("drawn.safetensors"), dir.join("o.safetensors"));
    let sets = ["--set", "N=48", "--set", "H=2", "--set", "d=8"];
    let o =
        attnc(&[&["run", "stdlib/document.attn", "--seed", "3", "--out", out.to_str().unwrap()][..], &sets].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    // `run --seed` writes the drawn inputs next to the outputs: bench on them.
    let o = attnc(
        &[
            &["bench", "stdlib/document.attn", "--inputs", out.to_str().unwrap(), "--iters", "1", "--warmup", "0"][..],
            &sets,
        ]
        .concat(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("B=1 N=48") || text.contains("all kernels per call"), "{text}");
    // Inputs of another shape than --set implies are refused with the tensor named.
    std::fs::copy(&out, &drawn).unwrap();
    let o =
        attnc(&["bench", "stdlib/document.attn", "--inputs", drawn.to_str().unwrap(), "--set", "H=4", "--iters", "1"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("error[E0601]") && stderr(&o).contains("tensor `q`"), "{}", stderr(&o));
    std::fs::remove_dir_all(&dir).unwrap();
}
