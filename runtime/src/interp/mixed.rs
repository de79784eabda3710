//! Attention that mixes heads inside the softmax (Talking-Heads Attention,
//! Shazeer et al. 2020; docs/semantics.md §7) in float64: for batch `b` and
//! query row `i`, each query head `m`'s score `s[m, j]` (scaled logit, then
//! the score function), the softmax heads' mixed logits
//! `s̃[h, j] = Σ_m wl[m, h] · s[m, j]` (masked per softmax head `h`), their
//! probabilities `p[h, j]`, the output heads' mixed probabilities
//! `p̃[g, j] = Σ_h wp[h, g] · p[h, j]` and outputs `o[g] = Σ_j p̃[g, j] · v[kv(g), j]`.
//! A missing matrix is the identity.

use super::attention::Scores;
use super::backward::{read_partials, scatter_reads};
use super::func::ReadError;
use crate::tensor::Tensor;
use attnc_compiler::ir::{AttnArg, HeadMix};

/// Attention's scores with its mixing matrices.
pub(super) struct Mixed<'s, 'a> {
    pub scores: &'s Scores<'a>,
    mix: HeadMix,
    wl: Option<&'a Tensor>,
    wp: Option<&'a Tensor>,
    /// Query, softmax and output heads.
    hq: usize,
    hs: usize,
    ho: usize,
}

/// One query row's visible keys (seen by at least one softmax head): for
/// each, every query head's `[logit, score, slope]` and every softmax
/// head's mixed logit (`None` where its mask hides the key).
struct Row {
    keys: Vec<usize>,
    src: Vec<[f64; 3]>,
    mixed: Vec<Option<f64>>,
}

impl<'s, 'a> Mixed<'s, 'a> {
    pub fn new(scores: &'s Scores<'a>) -> Mixed<'s, 'a> {
        let mix = scores.fns.as_ref().map(|(f, _)| f.mix).unwrap_or_default();
        let (wl, wp) = (mix.logits.map(|c| scores.capture(c)), mix.probs.map(|c| scores.capture(c)));
        let hq = scores.q.shape[1];
        let hs = wl.map_or(hq, |w| w.shape[1]);
        let ho = wp.map_or(hs, |w| w.shape[1]);
        Mixed { scores, mix, wl, wp, hq, hs, ho }
    }

    fn wl(&self, m: usize, h: usize) -> f64 {
        self.wl.map_or((m == h) as u8 as f64, |w| w.data[m * self.hs + h])
    }

    fn wp(&self, h: usize, g: usize) -> f64 {
        self.wp.map_or((h == g) as u8 as f64, |w| w.data[h * self.ho + g])
    }

    fn row(&self, bi: usize, i: usize) -> Result<Row, ReadError> {
        let (hq, hs) = (self.hq, self.hs);
        let mut row = Row { keys: vec![], src: vec![], mixed: vec![] };
        let mut seen = vec![false; hs];
        for j in 0..self.scores.k.shape[2] {
            for (h, v) in seen.iter_mut().enumerate() {
                *v = self.scores.visible(bi, h, i, j)?;
            }
            if !seen.contains(&true) {
                continue;
            }
            row.keys.push(j);
            let base = row.src.len();
            for m in 0..hq {
                row.src.push(self.scores.source(bi, m, i, j)?);
            }
            for (h, v) in seen.iter().enumerate() {
                let mixed = match self.wl {
                    // Without a logit matrix, no product: an infinite score stays one.
                    None => row.src[base + h][1],
                    Some(_) => (0..hq).map(|m| self.wl(m, h) * row.src[base + m][1]).sum(),
                };
                row.mixed.push(v.then_some(mixed));
            }
        }
        Ok(row)
    }

    /// Each softmax head's log-sum-exp over its visible keys (−∞ for none).
    fn lse(&self, row: &Row) -> Vec<f64> {
        (0..self.hs)
            .map(|h| {
                let xs: Vec<f64> = row.mixed.iter().skip(h).step_by(self.hs).flatten().copied().collect();
                let max = xs.iter().copied().fold(f64::NEG_INFINITY, |a, x| {
                    if x.is_nan() || a.is_nan() {
                        f64::NAN
                    } else {
                        a.max(x)
                    }
                });
                match xs.is_empty() {
                    true => f64::NEG_INFINITY,
                    false if max.is_finite() => max + xs.iter().map(|x| (x - max).exp()).sum::<f64>().ln(),
                    false => max,
                }
            })
            .collect()
    }

    /// The probabilities `p[jj·hs + h]` of a row from its softmax heads' log-sum-exp.
    fn probs(&self, row: &Row, lse: impl Fn(usize) -> f64) -> Vec<f64> {
        let hs = self.hs;
        (row.mixed.iter().enumerate())
            .map(|(x, s)| match (s, lse(x % hs)) {
                (_, f64::NEG_INFINITY) | (None, _) => 0.0,
                (Some(s), l) => (s - l).exp(),
            })
            .collect()
    }

    /// The output heads' mixed probabilities `p̃[jj·ho + g]`.
    fn mix_probs(&self, p: &[f64]) -> Vec<f64> {
        let (hs, ho) = (self.hs, self.ho);
        let mut out = vec![0.0; p.len() / hs * ho];
        for (jj, pj) in p.chunks(hs).enumerate() {
            for g in 0..ho {
                out[jj * ho + g] = match self.wp {
                    None => pj[g],
                    Some(_) => (0..hs).map(|h| self.wp(h, g) * pj[h]).sum(),
                };
            }
        }
        out
    }
}

/// The forward; `round` rounds the mixed probabilities before they weigh the values.
pub(super) fn attention(
    mixed: &Mixed,
    v: &Tensor,
    shape: Vec<usize>,
    round: &dyn Fn(f64) -> f64,
) -> Result<Tensor, ReadError> {
    let q = mixed.scores.q;
    let (b, s, ho) = (q.shape[0], q.shape[2], mixed.ho);
    let (hv, sk, e) = (v.shape[1], v.shape[2], v.shape[3]);
    let mut out = Tensor::zeros(shape);
    for bi in 0..b {
        for i in 0..s {
            let row = mixed.row(bi, i)?;
            let lse = mixed.lse(&row);
            let pt = mixed.mix_probs(&mixed.probs(&row, |h| lse[h]));
            for (jj, &j) in row.keys.iter().enumerate() {
                for g in 0..ho {
                    let w = round(pt[jj * ho + g]);
                    let vrow = &v.data[((bi * hv + g / (ho / hv)) * sk + j) * e..][..e];
                    let orow = ((bi * ho + g) * s + i) * e;
                    for (o, x) in out.data[orow..orow + e].iter_mut().zip(vrow) {
                        *o += w * x;
                    }
                }
            }
        }
    }
    Ok(out)
}

/// Each softmax head's log-sum-exp per query row, `[B, H_s, S]`.
pub(super) fn lse(mixed: &Mixed, shape: Vec<usize>) -> Result<Tensor, ReadError> {
    let q = mixed.scores.q;
    let (b, s, hs) = (q.shape[0], q.shape[2], mixed.hs);
    let mut out = Tensor::zeros(shape);
    for bi in 0..b {
        for i in 0..s {
            for (h, l) in mixed.lse(&mixed.row(bi, i)?).into_iter().enumerate() {
                out.data[(bi * hs + h) * s + i] = l;
            }
        }
    }
    Ok(out)
}

/// `D[h]` of every query row and softmax head, `[B, H_s, S]` (`AttentionDelta`).
pub(super) fn delta(mixed: &Mixed, [v, dout, lse]: [&Tensor; 3], shape: Vec<usize>) -> Result<Tensor, ReadError> {
    let q = mixed.scores.q;
    let (b, s, hs) = (q.shape[0], q.shape[2], mixed.hs);
    let mut out = Tensor::zeros(shape);
    for bi in 0..b {
        for i in 0..s {
            let row = mixed.row(bi, i)?;
            let p = mixed.probs(&row, |h| lse.data[(bi * hs + h) * s + i]);
            let dp = mixed.dp(&row, [v, dout], bi, i);
            for h in 0..hs {
                out.data[(bi * hs + h) * s + i] = (0..row.keys.len()).map(|jj| p[jj * hs + h] * dp[jj * hs + h]).sum();
            }
        }
    }
    Ok(out)
}

impl Mixed<'_, '_> {
    /// `dp̃[jj·H_o + g] = dO[g] · v[kv'(g), j]` of a row's keys.
    fn dpt(&self, row: &Row, [v, dout]: [&Tensor; 2], bi: usize, i: usize) -> Vec<f64> {
        let (s, ho, hv, sk, e) = (self.scores.q.shape[2], self.ho, v.shape[1], v.shape[2], v.shape[3]);
        let mut dpt = vec![0.0; row.keys.len() * ho];
        for (jj, &j) in row.keys.iter().enumerate() {
            for g in 0..ho {
                let dout_row = &dout.data[((bi * ho + g) * s + i) * e..][..e];
                let v_row = &v.data[((bi * hv + g / (ho / hv)) * sk + j) * e..][..e];
                dpt[jj * ho + g] = dout_row.iter().zip(v_row).map(|(a, b)| a * b).sum();
            }
        }
        dpt
    }

    /// `dp[jj·H_s + h] = Σ_g wp[h, g] dp̃[g, j]`.
    fn dp(&self, row: &Row, vd: [&Tensor; 2], bi: usize, i: usize) -> Vec<f64> {
        let (hs, ho) = (self.hs, self.ho);
        let dpt = self.dpt(row, vd, bi, i);
        (0..row.keys.len() * hs)
            .map(|x| {
                let (jj, h) = (x / hs, x % hs);
                match self.wp {
                    None => dpt[jj * ho + h],
                    Some(_) => (0..ho).map(|g| self.wp(h, g) * dpt[jj * ho + g]).sum(),
                }
            })
            .collect()
    }
}

/// The gradient in `wrt`. With `dp̃[g, j] = dO[g] · v[kv(g), j]`,
/// `dp[h, j] = Σ_g wp[h, g] dp̃[g, j]`, `D[h] = Σ_j p[h, j] dp[h, j]`,
/// `ds̃[h, j] = p[h, j] (dp[h, j] − D[h])` and `ds[m, j] = Σ_h wl[m, h] ds̃[h, j]`:
/// `dv[kv(g), j] += p̃[g, j] dO[g]`, `dwp[h, g] += p[h, j] dp̃[g, j]`,
/// `dwl[m, h] += s[m, j] ds̃[h, j]`, and `ds` times the score's slope is the
/// logit's gradient, which gives `dq` and `dk` as without mixing. Sums run
/// in a fixed order.
pub(super) fn grad(
    mixed: &Mixed,
    [v, dout, lse]: [&Tensor; 3],
    wrt: AttnArg,
    shape: Vec<usize>,
) -> Result<Tensor, ReadError> {
    let scores = mixed.scores;
    let (q, k, scale) = (scores.q, scores.k, scores.scale);
    let (b, s, d) = (q.shape[0], q.shape[2], q.shape[3]);
    let (hk, sk, hv, e) = (k.shape[1], k.shape[2], v.shape[1], v.shape[3]);
    let (hq, hs, ho) = (mixed.hq, mixed.hs, mixed.ho);
    let mut out = Tensor::zeros(shape);
    let reads = read_partials(scores, wrt);
    let (wl_wanted, wp_wanted) = match wrt {
        AttnArg::Read(c) => (mixed.mix.logits == Some(c), mixed.mix.probs == Some(c)),
        _ => (false, false),
    };
    for bi in 0..b {
        for i in 0..s {
            let row = mixed.row(bi, i)?;
            let p = mixed.probs(&row, |h| lse.data[(bi * hs + h) * s + i]);
            let n = row.keys.len();
            let dout_row = |g: usize| &dout.data[((bi * ho + g) * s + i) * e..][..e];
            let dpt = mixed.dpt(&row, [v, dout], bi, i);
            if wrt == AttnArg::V {
                let pt = mixed.mix_probs(&p);
                for (jj, &j) in row.keys.iter().enumerate() {
                    for g in 0..ho {
                        let at = ((bi * hv + g / (ho / hv)) * sk + j) * e;
                        for (o, x) in out.data[at..at + e].iter_mut().zip(dout_row(g)) {
                            *o += pt[jj * ho + g] * x;
                        }
                    }
                }
                continue;
            }
            // A mixing matrix's gradient per (batch, query row): `[B, S, rows, cols]`.
            let at = (bi * s + i) * if wp_wanted { hs * ho } else { hq * hs };
            if wp_wanted {
                for jj in 0..n {
                    for h in 0..hs {
                        for g in 0..ho {
                            out.data[at + h * ho + g] += p[jj * hs + h] * dpt[jj * ho + g];
                        }
                    }
                }
            }
            let dp = mixed.dp(&row, [v, dout], bi, i);
            let delta: Vec<f64> = (0..hs).map(|h| (0..n).map(|jj| p[jj * hs + h] * dp[jj * hs + h]).sum()).collect();
            let dst: Vec<f64> = (0..n * hs).map(|x| p[x] * (dp[x] - delta[x % hs])).collect();
            if wl_wanted {
                for jj in 0..n {
                    for m in 0..hq {
                        for h in 0..hs {
                            if row.mixed[jj * hs + h].is_some() {
                                out.data[at + m * hs + h] += row.src[jj * hq + m][1] * dst[jj * hs + h];
                            }
                        }
                    }
                }
            }
            for (jj, &j) in row.keys.iter().enumerate() {
                for m in 0..hq {
                    let ds = match mixed.wl {
                        None => dst[jj * hs + m],
                        Some(_) => (0..hs).map(|h| mixed.wl(m, h) * dst[jj * hs + h]).sum(),
                    };
                    let [logit, _, slope] = row.src[jj * hq + m];
                    let qrow = ((bi * hq + m) * s + i) * d;
                    let krow = ((bi * hk + m / (hq / hk)) * sk + j) * d;
                    match wrt {
                        AttnArg::Q => {
                            for c in 0..d {
                                out.data[qrow + c] += scale * ds * slope * k.data[krow + c];
                            }
                        }
                        AttnArg::K => {
                            for c in 0..d {
                                out.data[krow + c] += scale * ds * slope * q.data[qrow + c];
                            }
                        }
                        AttnArg::Read(_) => scatter_reads(scores, &reads, &mut out, ds, logit, [bi, m, i, j])?,
                        AttnArg::V => unreachable!("handled above"),
                    }
                }
            }
        }
    }
    Ok(out)
}
