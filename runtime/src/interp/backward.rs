//! The interpreter's gradient operations (`compiler::grad`): each the plain
//! float64 loop of its definition in `ir::Op`.

use super::attention::{row_max, Scores};
use super::func::ReadError;
use crate::tensor::Tensor;
use attnc_compiler::ir::{AttnArg, Func, Weights};

pub(super) fn transpose(x: &Tensor, shape: Vec<usize>) -> Tensor {
    let (k, f) = (x.shape[0], x.shape[1]);
    let mut out = Tensor::zeros(shape);
    for i in 0..k {
        for j in 0..f {
            out.data[j * k + i] = x.data[i * f + j];
        }
    }
    out
}

/// `out[k, f] = Σ_r a[r, k] · b[r, f]` over every leading index `r`.
pub(super) fn matmul_at(a: &Tensor, b: &Tensor, shape: Vec<usize>) -> Tensor {
    let (k, f) = (shape[0], shape[1]);
    let rows = a.len().checked_div(k).unwrap_or(0);
    let mut out = Tensor::zeros(shape);
    for r in 0..rows {
        for i in 0..k {
            let x = a.data[r * k + i];
            for j in 0..f {
                out.data[i * f + j] += x * b.data[r * f + j];
            }
        }
    }
    out
}

/// `out[b,m,s,e] = Σ_{h,j} alpha[m,h,j] · y[b,h,j,s,e]`.
pub(super) fn mix_heads_t(y: &Tensor, alpha: &Tensor, shape: Vec<usize>) -> Tensor {
    let (b, h, p, s, d) = (y.shape[0], y.shape[1], y.shape[2], y.shape[3], y.shape[4]);
    let m = alpha.shape[0];
    let mut out = Tensor::zeros(shape);
    for bi in 0..b {
        for mi in 0..m {
            for hi in 0..h {
                for j in 0..p {
                    let a = alpha.data[(mi * h + hi) * p + j];
                    for si in 0..s {
                        for e in 0..d {
                            out.data[((bi * m + mi) * s + si) * d + e] +=
                                a * y.data[(((bi * h + hi) * p + j) * s + si) * d + e];
                        }
                    }
                }
            }
        }
    }
    out
}

/// `out[m,h,j] = Σ_{b,s,e} x[b,m,s,e] · dy[b,h,j,s,e]`.
pub(super) fn mix_heads_grad(x: &Tensor, dy: &Tensor, shape: Vec<usize>) -> Tensor {
    let (b, m, s, d) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3]);
    let (h, p) = (dy.shape[1], dy.shape[2]);
    let mut out = Tensor::zeros(shape);
    for mi in 0..m {
        for hi in 0..h {
            for j in 0..p {
                let mut acc = 0.0;
                for bi in 0..b {
                    for i in 0..s * d {
                        acc += x.data[(bi * m + mi) * s * d + i] * dy.data[((bi * h + hi) * p + j) * s * d + i];
                    }
                }
                out.data[(mi * h + hi) * p + j] = acc;
            }
        }
    }
    out
}

/// `out[b,h',j,s,e] = Σ_h r[h, h'·P + j] · dy[b,h,s,e]`.
pub(super) fn collapse_t(dy: &Tensor, r: &Tensor, shape: Vec<usize>) -> Tensor {
    let (b, h, s, d) = (dy.shape[0], dy.shape[1], dy.shape[2], dy.shape[3]);
    let (hs, p) = (shape[1], shape[2]);
    let mut out = Tensor::zeros(shape);
    for bi in 0..b {
        for hp in 0..hs {
            for j in 0..p {
                for hi in 0..h {
                    let w = r.data[hi * hs * p + hp * p + j];
                    for i in 0..s * d {
                        out.data[((bi * hs + hp) * p + j) * s * d + i] += w * dy.data[(bi * h + hi) * s * d + i];
                    }
                }
            }
        }
    }
    out
}

/// `out[h, h'·P + j] = Σ_{b,s,e} dy[b,h,s,e] · x[b,h',j,s,e]`.
pub(super) fn collapse_grad(x: &Tensor, dy: &Tensor, shape: Vec<usize>) -> Tensor {
    let (b, hs, p, s, d) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3], x.shape[4]);
    let h = dy.shape[1];
    let mut out = Tensor::zeros(shape);
    for hi in 0..h {
        for c in 0..hs * p {
            let mut acc = 0.0;
            for bi in 0..b {
                for i in 0..s * d {
                    acc += dy.data[(bi * h + hi) * s * d + i] * x.data[(bi * hs * p + c) * s * d + i];
                }
            }
            out.data[hi * hs * p + c] = acc;
        }
    }
    out
}

/// Per query row, the statistic attention's backward reads: a softmax's
/// `log Σ_j exp(score)` over visible keys (and the sink), hard attention's
/// max, 0 for sigmoid and linear weights; −∞ for a row that sees no key.
pub(super) fn attention_lse(scores: &Scores, shape: Vec<usize>) -> Result<Tensor, ReadError> {
    let (b, h, s) = (scores.q.shape[0], scores.q.shape[1], scores.q.shape[2]);
    let sink = scores.sink();
    let sk = scores.k.shape[2];
    let mut out = Tensor::zeros(shape);
    for bi in 0..b {
        for hi in 0..h {
            for i in 0..s {
                let mut row = Vec::with_capacity(sk);
                for j in 0..sk {
                    row.extend(scores.at(bi, hi, i, j)?);
                }
                // A softmax's sink joins the denominator of a row that sees a key.
                if let (Some(t), false) = (sink, row.is_empty()) {
                    row.push(t.data[hi]);
                }
                let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                // What the backward needs of a row (docs/semantics.md §9): a
                // softmax's log-sum-exp; hard attention's max; nothing (0) for
                // sigmoid and linear weights.
                out.data[(bi * h + hi) * s + i] = if row.is_empty() {
                    f64::NEG_INFINITY
                } else if scores.weights() == Weights::Hard {
                    max
                } else if !scores.weights().is_softmax() {
                    0.0
                } else if max.is_finite() {
                    max + row.iter().map(|x| (x - max).exp()).sum::<f64>().ln()
                } else {
                    max
                };
            }
        }
    }
    Ok(out)
}

/// For `wrt` a tensor the score function reads: each read's indices and
/// partial derivative by the value read, as functions of the score
/// function's parameters.
pub(super) fn read_partials(scores: &Scores, wrt: AttnArg) -> Vec<(Vec<Func>, Func)> {
    match (wrt, scores.fns.as_ref().and_then(|(f, _)| f.score.as_ref())) {
        (AttnArg::Read(c), Some(f)) => (attnc_compiler::grad::read_partials(f, c).into_iter())
            .map(|(idx, partial)| {
                let idx = idx.into_iter().map(|body| Func { body, ..partial.clone() }).collect();
                (idx, partial)
            })
            .collect(),
        _ => vec![],
    }
}

/// Adds `value` times each read's partial at pair `at` (scaled logit
/// `logit`) into the entry of `out` it reads.
pub(super) fn scatter_reads(
    scores: &Scores,
    reads: &[(Vec<Func>, Func)],
    out: &mut Tensor,
    value: f64,
    logit: f64,
    at: [usize; 4],
) -> Result<(), ReadError> {
    for (idx, partial) in reads {
        let mut flat = 0;
        for (f, n) in idx.iter().zip(&out.shape) {
            flat = flat * n + scores.call(f, logit, at)?.int() as usize;
        }
        out.data[flat] += value * scores.call(partial, logit, at)?.float();
    }
    Ok(())
}

/// The gradient of attention in `wrt` (FlashAttention-2's backward, in
/// float64): with `P_ij = exp(score_ij − lse_i)`, `D_i = Σ_e dO_ie · O_ie`,
/// `dS_ij = P_ij (dO_i · V_j − D_i)`: `dQ_i = scale Σ_j dS_ij K_j`,
/// `dK_j = scale Σ_i dS_ij Q_i`, `dV_j = Σ_i P_ij dO_i`, key/value heads
/// summing over the query heads that share them. A score function `f`
/// multiplies `dS_ij` by `∂f/∂s` at the scaled logit.
pub(super) fn attention_grad(
    scores: &Scores,
    [v, o, dout, lse]: [&Tensor; 4],
    wrt: AttnArg,
    shape: Vec<usize>,
) -> Result<Tensor, ReadError> {
    let (q, k, scale) = (scores.q, scores.k, scores.scale);
    let (b, h, s, d) = (q.shape[0], q.shape[1], q.shape[2], q.shape[3]);
    let (hk, sk, e) = (k.shape[1], k.shape[2], v.shape[3]);
    let mut out = Tensor::zeros(shape);
    let reads = read_partials(scores, wrt);
    let weights = scores.weights();
    let sink = scores.sink().filter(|_| matches!(wrt, AttnArg::Read(c) if scores.sink_capture() == Some(c)));
    for bi in 0..b {
        for hi in 0..h {
            let g = hi / (h / hk);
            for i in 0..s {
                let row = (bi * h + hi) * s + i;
                let l = lse.data[row];
                if l == f64::NEG_INFINITY {
                    continue; // the row saw no key: its output is the constant 0
                }
                let (o_i, do_i) = (&o.data[row * e..][..e], &dout.data[row * e..][..e]);
                let delta: f64 = o_i.iter().zip(do_i).map(|(a, b)| a * b).sum();
                // The sink's weight is exp(t − lse); its "value" is 0, so dt = −D · exp(t − lse).
                if let Some(t) = sink {
                    out.data[hi] -= delta * (t.data[hi] - l).exp();
                }
                // Each visible pair's logit, score and slope, once.
                let pairs = (0..sk).map(|j| scores.with_slope(bi, hi, i, j)).collect::<Result<Vec<_>, _>>()?;
                // Hard attention: the row's maximal score and how many tie.
                let top = row_max(pairs.iter().flatten().map(|[_, sc, _]| *sc));
                let ties = pairs.iter().flatten().filter(|[_, sc, _]| *sc == top).count() as f64;
                for (j, pair) in pairs.into_iter().enumerate() {
                    let Some([logit, sc, slope]) = pair else { continue };
                    let kv = (bi * hk + g) * sk + j;
                    let v_j = &v.data[kv * e..][..e];
                    let dp: f64 = do_i.iter().zip(v_j).map(|(a, b)| a * b).sum();
                    // The weight and dL/d(score) (docs/semantics.md §9).
                    let (p, dscore) = match weights {
                        Weights::Softmax => {
                            let p = (sc - l).exp();
                            (p, p * (dp - delta))
                        }
                        Weights::Sigmoid => {
                            let p = 1.0 / (1.0 + (-sc).exp());
                            (p, p * (1.0 - p) * dp)
                        }
                        Weights::Linear => (sc, dp),
                        Weights::Hard if top.is_nan() => (f64::NAN, f64::NAN),
                        Weights::Hard => (f64::from(u8::from(sc == top)) / ties, 0.0),
                    };
                    let ds = dscore * slope;
                    match wrt {
                        AttnArg::Q => {
                            for c in 0..d {
                                out.data[row * d + c] += scale * ds * k.data[kv * d + c];
                            }
                        }
                        AttnArg::K => {
                            for c in 0..d {
                                out.data[kv * d + c] += scale * ds * q.data[row * d + c];
                            }
                        }
                        AttnArg::V => {
                            for (o, dout) in out.data[kv * e..][..e].iter_mut().zip(do_i) {
                                *o += p * dout;
                            }
                        }
                        // dS of the logit (before the slope) times ∂f/∂(value read), into the entry read.
                        AttnArg::Read(_) => scatter_reads(scores, &reads, &mut out, dscore, logit, [bi, hi, i, j])?,
                    }
                }
            }
        }
    }
    Ok(out)
}

/// `out[.., m·d + e] = Σ_{h,j} alpha[m,h,j] · dy[.., (h·P + j)·d + e]`.
pub(super) fn mix_cols_t(dy: &Tensor, alpha: &Tensor, shape: Vec<usize>) -> Tensor {
    let (m, hp) = (alpha.shape[0], alpha.shape[1] * alpha.shape[2]);
    let cols = *dy.shape.last().unwrap();
    let d = cols / hp;
    let rows = dy.len().checked_div(cols).unwrap_or(0);
    let mut out = Tensor::zeros(shape);
    for r in 0..rows {
        for mi in 0..m {
            for t in 0..hp {
                let a = alpha.data[mi * hp + t];
                for e in 0..d {
                    out.data[(r * m + mi) * d + e] += a * dy.data[r * cols + t * d + e];
                }
            }
        }
    }
    out
}

/// `out[m,h,j] = Σ_{r,e} y[r, m·d + e] · dy[r, (h·P + j)·d + e]`.
pub(super) fn mix_cols_grad(y: &Tensor, dy: &Tensor, shape: Vec<usize>) -> Tensor {
    let (m, hp) = (shape[0], shape[1] * shape[2]);
    let (ycols, dcols) = (*y.shape.last().unwrap(), *dy.shape.last().unwrap());
    let d = ycols / m;
    let rows = y.len().checked_div(ycols).unwrap_or(0);
    let mut out = Tensor::zeros(shape);
    for mi in 0..m {
        for t in 0..hp {
            let mut acc = 0.0;
            for r in 0..rows {
                for e in 0..d {
                    acc += y.data[r * ycols + mi * d + e] * dy.data[r * dcols + t * d + e];
                }
            }
            out.data[mi * hp + t] = acc;
        }
    }
    out
}

/// `out[h, c] = Σ_{r,e} dy[r, h·d + e] · y[r, c·d + e]`.
pub(super) fn collapse_cols_grad(y: &Tensor, dy: &Tensor, shape: Vec<usize>) -> Tensor {
    let (h, c) = (shape[0], shape[1]);
    let (ycols, dcols) = (*y.shape.last().unwrap(), *dy.shape.last().unwrap());
    let d = dcols / h;
    let rows = y.len().checked_div(ycols).unwrap_or(0);
    let mut out = Tensor::zeros(shape);
    for hi in 0..h {
        for ci in 0..c {
            let mut acc = 0.0;
            for r in 0..rows {
                for e in 0..d {
                    acc += dy.data[r * dcols + hi * d + e] * y.data[r * ycols + ci * d + e];
                }
            }
            out.data[hi * c + ci] = acc;
        }
    }
    out
}

/// `out[h, c] = Σ_{e,f} w[h·d + e, f] · dy[c·d + e, f]`.
pub(super) fn collapse_rows_grad(w: &Tensor, dy: &Tensor, shape: Vec<usize>) -> Tensor {
    let (h, c) = (shape[0], shape[1]);
    let f = w.shape[1];
    let d = w.shape[0] / h;
    let mut out = Tensor::zeros(shape);
    for hi in 0..h {
        for ci in 0..c {
            let mut acc = 0.0;
            for e in 0..d {
                for j in 0..f {
                    acc += w.data[(hi * d + e) * f + j] * dy.data[(ci * d + e) * f + j];
                }
            }
            out.data[hi * c + ci] = acc;
        }
    }
    out
}
