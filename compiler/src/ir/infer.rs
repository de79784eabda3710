//! [`Op::infer`]: the single implementation of every op's shape rules, used
//! by lowering and by the validator alike.

use super::*;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapeError {
    pub kind: ShapeErrorKind,
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShapeErrorKind {
    Mismatch,
    Rank,
    NotDivisible,
    BadSize,
}

fn err<T>(kind: ShapeErrorKind, message: String) -> Result<T, ShapeError> {
    Err(ShapeError { kind, message })
}

fn want_rank(what: &str, s: &Shape, rank: usize) -> Result<(), ShapeError> {
    if s.rank() != rank {
        return err(ShapeErrorKind::Rank, format!("{what} must have {rank} axes, but has shape {s}"));
    }
    Ok(())
}

fn want_min_rank(what: &str, s: &Shape, rank: usize) -> Result<(), ShapeError> {
    if s.rank() < rank {
        return err(ShapeErrorKind::Rank, format!("{what} must have at least {rank} axes, but has shape {s}"));
    }
    Ok(())
}

impl Op {
    /// The result shape, from the operands' shapes. `Input` has no rule here:
    /// its shape is the declaration's.
    pub fn infer(&self, shape: &dyn Fn(NodeId) -> Shape) -> Result<Shape, ShapeError> {
        use ShapeErrorKind::*;
        Ok(match *self {
            Op::Input { .. } => unreachable!("inputs carry their declared shape"),
            Op::Scalar { .. } => Shape(vec![]),
            Op::MatMul { a, b } => {
                let (sa, sb) = (shape(a), shape(b));
                want_min_rank("the left operand of `@`", &sa, 2)?;
                want_rank("the right operand of `@` (a weight matrix)", &sb, 2)?;
                if sa.back(1) != &sb.0[0] {
                    return err(
                        Mismatch,
                        format!("cannot multiply {sa} by {sb}: inner sizes {} and {} differ", sa.back(1), sb.0[0]),
                    );
                }
                let mut out = sa.0.clone();
                *out.last_mut().unwrap() = sb.0[1].clone();
                Shape(out)
            }
            Op::SplitHeads { x, heads } => {
                let s = shape(x);
                want_min_rank("the operand of `split_heads`", &s, 2)?;
                if heads == 0 {
                    return err(BadSize, "the number of heads must be at least 1".into());
                }
                let Some(d) = s.back(1).div_exact(heads) else {
                    return err(NotDivisible, format!("the last axis of {s} does not split into {heads} heads"));
                };
                let mut out = s.0[..s.rank() - 1].to_vec();
                out.insert(s.rank() - 2, Dim::known(heads));
                out.push(d);
                Shape(out)
            }
            Op::MergeHeads { x } => {
                let s = shape(x);
                want_min_rank("the operand of `merge_heads`", &s, 3)?;
                let r = s.rank();
                let merged =
                    s.0[r - 3].mul(&s.0[r - 1]).ok_or(ShapeError { kind: BadSize, message: "size overflow".into() })?;
                let mut out = s.0[..r - 3].to_vec();
                out.push(s.0[r - 2].clone());
                out.push(merged);
                Shape(out)
            }
            Op::MixHeads { x, alpha } => {
                let (sx, sa) = (shape(x), shape(alpha));
                want_rank("the operand of `mix_heads`", &sx, 4)?;
                want_rank("the mixing coefficients", &sa, 3)?;
                if sa.0[0] != sx.0[1] {
                    return err(
                        Mismatch,
                        format!(
                            "mixing coefficients {sa} expect {} source heads, but the operand {sx} has {}",
                            sa.0[0], sx.0[1]
                        ),
                    );
                }
                Shape(vec![sx.0[0].clone(), sa.0[1].clone(), sa.0[2].clone(), sx.0[2].clone(), sx.0[3].clone()])
            }
            Op::Interleave { x } => {
                let s = shape(x);
                want_rank("the operand of `interleave`", &s, 5)?;
                let rows = s.0[3].mul(&s.0[2]).ok_or(ShapeError { kind: BadSize, message: "size overflow".into() })?;
                Shape(vec![s.0[0].clone(), s.0[1].clone(), rows, s.0[4].clone()])
            }
            Op::Deinterleave { x, pseudo } => {
                let s = shape(x);
                want_rank("the operand of `deinterleave`", &s, 4)?;
                let Some(n) = s.0[2].div_exact(pseudo) else {
                    return err(
                        NotDivisible,
                        format!("the sequence axis {} of {s} is not a multiple of {pseudo} pseudo-heads", s.0[2]),
                    );
                };
                Shape(vec![s.0[0].clone(), s.0[1].clone(), Dim::known(pseudo), n, s.0[3].clone()])
            }
            Op::BlockDiag { r, block } => {
                let s = shape(r);
                want_rank("the collapse matrix", &s, 2)?;
                if s.0[0].mul(&Dim::known(block)).as_ref() != Some(&s.0[1]) {
                    return err(
                        Mismatch,
                        format!("a per-head collapse matrix must be [H, H*{block}], but has shape {s}"),
                    );
                }
                s
            }
            Op::Collapse { x, r } => {
                let (sx, sr) = (shape(x), shape(r));
                want_rank("the operand of `collapse`", &sx, 5)?;
                want_rank("the collapse matrix", &sr, 2)?;
                let cols = sx.0[1].mul(&sx.0[2]);
                if cols.as_ref() != Some(&sr.0[1]) {
                    return err(
                        Mismatch,
                        format!(
                            "collapse matrix {sr} must have {} columns (heads × pseudo-heads of {sx})",
                            cols.map_or("?".into(), |c| c.to_string())
                        ),
                    );
                }
                Shape(vec![sx.0[0].clone(), sr.0[0].clone(), sx.0[3].clone(), sx.0[4].clone()])
            }
            Op::Paged { cache, pages } => {
                let (sc, sp) = (shape(cache), shape(pages));
                want_rank("a paged cache", &sc, 4)?;
                want_rank("a block table", &sp, 2)?;
                let rows =
                    sp.0[1].mul(&sc.0[1]).ok_or(ShapeError { kind: BadSize, message: "size overflow".into() })?;
                Shape(vec![sp.0[0].clone(), sc.0[2].clone(), rows, sc.0[3].clone()])
            }
            Op::Rope { x, .. } => {
                let s = shape(x);
                want_min_rank("the operand of `rope`", &s, 2)?;
                if s.back(1).as_known().is_none_or(|d| d % 2 != 0) {
                    return err(
                        NotDivisible,
                        format!("rope needs an even, known head width, but the operand has shape {s}"),
                    );
                }
                s
            }
            Op::Attention { q, k, v, mask, ref fns, .. } => {
                let (sq, sk, sv) = (shape(q), shape(k), shape(v));
                want_rank("the queries", &sq, 4)?;
                want_rank("the keys", &sk, 4)?;
                want_rank("the values", &sv, 4)?;
                let mixes = fns.as_ref().is_some_and(|f| f.mixes());
                if sk.0[0] != sv.0[0] || sk.0[2] != sv.0[2] || (!mixes && sk.0[1] != sv.0[1]) {
                    return err(Mismatch, format!("keys {sk} and values {sv} differ in batch, heads or length"));
                }
                if sq.0[0] != sk.0[0] || sq.0[3] != sk.0[3] {
                    return err(Mismatch, format!("queries {sq} and keys {sk} differ in batch or width"));
                }
                let (hq, hk) = (sq.0[1].as_known(), sk.0[1].as_known());
                match (hq, hk) {
                    (Some(hq), Some(hk)) if hk > 0 && hq % hk == 0 => {}
                    _ => {
                        return err(
                            NotDivisible,
                            format!("key/value heads ({}) must divide query heads ({})", sk.0[1], sq.0[1]),
                        )
                    }
                }
                for axis in [&sq.0[2], &sk.0[2]] {
                    if mask.block == 0 || axis.div_exact(mask.block).is_none() {
                        return err(
                            NotDivisible,
                            format!("the sequence axis {axis} is not a multiple of the block size {}", mask.block),
                        );
                    }
                }
                if mask.window == Some(0) {
                    return err(BadSize, "the window must be at least 1 token".into());
                }
                let (_, ho) = mixed_heads(fns, &sq.0[1], shape)?;
                if mixes {
                    match (ho.as_known(), sv.0[1].as_known()) {
                        (Some(ho), Some(hv)) if hv > 0 && ho % hv == 0 => {}
                        _ => {
                            return err(
                                NotDivisible,
                                format!("value heads ({}) must divide the output heads of mix_probs ({ho})", sv.0[1]),
                            )
                        }
                    }
                }
                Shape(vec![sq.0[0].clone(), ho, sq.0[2].clone(), sv.0[3].clone()])
            }
            Op::Transpose { x } => {
                let s = shape(x);
                want_rank("the operand of a transpose", &s, 2)?;
                Shape(vec![s.0[1].clone(), s.0[0].clone()])
            }
            Op::MatMulAt { a, b } => {
                let (sa, sb) = (shape(a), shape(b));
                want_min_rank("the left operand of `aᵀ·b`", &sa, 1)?;
                if sa.rank() != sb.rank() || sa.0[..sa.rank() - 1] != sb.0[..sb.rank() - 1] {
                    return err(Mismatch, format!("`aᵀ·b` needs equal leading axes, but has {sa} and {sb}"));
                }
                Shape(vec![sa.back(1).clone(), sb.back(1).clone()])
            }
            Op::Unsqueeze { x, ref axes } => {
                let s = shape(x);
                let rank = s.rank() + axes.len();
                if axes.windows(2).any(|w| w[0] >= w[1]) || axes.iter().any(|a| *a >= rank) {
                    return err(BadSize, format!("cannot insert axes {axes:?} into {s}"));
                }
                let mut rest = s.0.into_iter();
                Shape((0..rank).map(|i| if axes.contains(&i) { Dim::known(1) } else { rest.next().unwrap() }).collect())
            }
            Op::MixHeadsT { y, alpha } => {
                let (sy, sa) = (shape(y), shape(alpha));
                want_rank("the operand of a transposed head mixing", &sy, 5)?;
                want_rank("the mixing coefficients", &sa, 3)?;
                if sa.0[1..] != sy.0[1..3] {
                    return err(Mismatch, format!("mixing coefficients {sa} do not match the mixed heads {sy}"));
                }
                Shape(vec![sy.0[0].clone(), sa.0[0].clone(), sy.0[3].clone(), sy.0[4].clone()])
            }
            Op::MixHeadsGrad { x, dy } => {
                let (sx, sy) = (shape(x), shape(dy));
                want_rank("the mixed operand", &sx, 4)?;
                want_rank("the mixing's cotangent", &sy, 5)?;
                if sx.0[0] != sy.0[0] || sx.0[2..] != sy.0[3..] {
                    return err(Mismatch, format!("head mixing's operand {sx} and cotangent {sy} differ"));
                }
                Shape(vec![sx.0[1].clone(), sy.0[1].clone(), sy.0[2].clone()])
            }
            Op::CollapseT { dy, r, pseudo } => {
                let (sy, sr) = (shape(dy), shape(r));
                want_rank("the collapse's cotangent", &sy, 4)?;
                want_rank("the collapse matrix", &sr, 2)?;
                let Some(heads) = sr.0[1].div_exact(pseudo).filter(|_| sr.0[0] == sy.0[1]) else {
                    return err(
                        Mismatch,
                        format!("collapse matrix {sr} does not match cotangent {sy} and P = {pseudo}"),
                    );
                };
                Shape(vec![sy.0[0].clone(), heads, Dim::known(pseudo), sy.0[2].clone(), sy.0[3].clone()])
            }
            Op::CollapseGrad { x, dy } => {
                let (sx, sy) = (shape(x), shape(dy));
                want_rank("the collapsed operand", &sx, 5)?;
                want_rank("the collapse's cotangent", &sy, 4)?;
                if sx.0[0] != sy.0[0] || sx.0[3..] != sy.0[2..] {
                    return err(Mismatch, format!("collapse's operand {sx} and cotangent {sy} differ"));
                }
                let cols =
                    sx.0[1].mul(&sx.0[2]).ok_or(ShapeError { kind: BadSize, message: "size overflow".into() })?;
                Shape(vec![sy.0[1].clone(), cols])
            }
            Op::MixColsT { dy, alpha } => {
                let (sy, sa) = (shape(dy), shape(alpha));
                want_min_rank("the cotangent of a column mixing", &sy, 1)?;
                want_rank("the mixing coefficients", &sa, 3)?;
                let targets =
                    sa.0[1].mul(&sa.0[2]).ok_or(ShapeError { kind: BadSize, message: "size overflow".into() })?;
                let d = match (sy.back(1).as_known(), targets.as_known()) {
                    (Some(cols), Some(t)) if t > 0 && cols % t == 0 => cols / t,
                    _ => return err(NotDivisible, format!("columns of {sy} do not split over {sa}'s targets")),
                };
                let mut out = sy.0.clone();
                *out.last_mut().unwrap() = sa.0[0].mul(&Dim::known(d)).unwrap();
                Shape(out)
            }
            Op::MixColsGrad { y, dy, m, h, p } => {
                let (sy, sd) = (shape(y), shape(dy));
                want_min_rank("a mixed operand", &sy, 1)?;
                if sy.rank() != sd.rank() || sy.0[..sy.rank() - 1] != sd.0[..sd.rank() - 1] {
                    return err(Mismatch, format!("column mixing's operand {sy} and cotangent {sd} differ"));
                }
                Shape(vec![Dim::known(m), Dim::known(h), Dim::known(p)])
            }
            Op::CollapseColsGrad { y, dy, h } => {
                let (sy, sd) = (shape(y), shape(dy));
                want_min_rank("a collapsed operand", &sy, 1)?;
                if sy.rank() != sd.rank() || sy.0[..sy.rank() - 1] != sd.0[..sd.rank() - 1] {
                    return err(Mismatch, format!("column collapse's operand {sy} and cotangent {sd} differ"));
                }
                let c = match (sy.back(1).as_known(), sd.back(1).as_known()) {
                    (Some(yc), Some(dc)) if h > 0 && dc % h == 0 && dc / h > 0 && yc % (dc / h) == 0 => yc / (dc / h),
                    _ => return err(NotDivisible, format!("{sy} and {sd} do not split into {h} heads")),
                };
                Shape(vec![Dim::known(h), Dim::known(c)])
            }
            Op::CollapseRowsGrad { w, dy, h } => {
                let (sw, sd) = (shape(w), shape(dy));
                want_rank("the folded weight", &sw, 2)?;
                want_rank("its cotangent", &sd, 2)?;
                let c = match (sw.0[0].as_known(), sd.0[0].as_known()) {
                    (Some(wr), Some(dr)) if h > 0 && wr % h == 0 && wr / h > 0 && dr % (wr / h) == 0 => dr / (wr / h),
                    _ => return err(NotDivisible, format!("{sw} and {sd} do not split into {h} heads")),
                };
                Shape(vec![Dim::known(h), Dim::known(c)])
            }
            Op::AttentionLse { q, k, ref fns, .. } => {
                let (sq, sk) = (shape(q), shape(k));
                want_rank("the queries", &sq, 4)?;
                want_rank("the keys", &sk, 4)?;
                let (hs, _) = mixed_heads(fns, &sq.0[1], shape)?;
                Shape(vec![sq.0[0].clone(), hs, sq.0[2].clone()])
            }
            Op::AttentionDelta { q, k, dout, lse, ref fns, .. } => {
                let (sq, sl) = (shape(q), shape(lse));
                want_rank("the queries", &sq, 4)?;
                want_rank("the keys", &shape(k), 4)?;
                want_rank("the output's cotangent", &shape(dout), 4)?;
                let (hs, _) = mixed_heads(fns, &sq.0[1], shape)?;
                let rows = Shape(vec![sq.0[0].clone(), hs, sq.0[2].clone()]);
                if sl != rows {
                    return err(Mismatch, format!("row statistics {sl} are not those of softmax heads {rows}"));
                }
                rows
            }
            Op::AttentionGrad { q, k, v, o, dout, lse, wrt, ref fns, .. } => {
                let (sq, mut so, sd, sl) = (shape(q), shape(o), shape(dout), shape(lse));
                let (hs, _) = mixed_heads(fns, &sq.0[1], shape)?;
                let mixes = fns.as_ref().is_some_and(|f| f.mixes());
                if mixes && so == sl {
                    so = sd.clone(); // `o` is the softmax heads' D
                }
                if so != sd || sl.0[..] != [sq.0[0].clone(), hs, sq.0[2].clone()] {
                    return err(
                        Mismatch,
                        format!("attention's output {so}, cotangent {sd} and row statistics {sl} differ"),
                    );
                }
                match wrt {
                    AttnArg::Q => sq,
                    AttnArg::K => shape(k),
                    AttnArg::V => shape(v),
                    AttnArg::Read(c) => match fns.as_ref().and_then(|f| f.captures.get(c).map(|id| (f, id))) {
                        Some((f, id)) if f.mix.reads(c) => {
                            let m = shape(*id);
                            Shape(vec![sq.0[0].clone(), sq.0[2].clone(), m.0[0].clone(), m.0[1].clone()])
                        }
                        Some((_, id)) => shape(*id),
                        None => return err(Mismatch, format!("attention reads no tensor {c}")),
                    },
                }
            }
            Op::Binary { a, b, op } => broadcast(&shape(a), &shape(b))
                .map_err(|m| ShapeError { kind: Mismatch, message: format!("`{op:?}`: {m}") })?,
            Op::Unary { x, .. } => shape(x),
            Op::Constant { ref values, ref shape } => {
                if shape.iter().product::<u64>() != values.len() as u64 {
                    return err(BadSize, format!("a constant of shape {shape:?} has {} values", values.len()));
                }
                Shape(shape.iter().map(|n| Dim::known(*n)).collect())
            }
            Op::Reduce { x, ref axes, keepdim, .. } => {
                let s = shape(x);
                if axes.is_empty() || axes.windows(2).any(|w| w[0] >= w[1]) || axes.iter().any(|a| *a >= s.rank()) {
                    return err(Rank, format!("cannot reduce axes {axes:?} of {s}"));
                }
                let dims = s.0.iter().enumerate().filter_map(|(i, d)| match (axes.contains(&i), keepdim) {
                    (false, _) => Some(d.clone()),
                    (true, true) => Some(Dim::known(1)),
                    (true, false) => None,
                });
                Shape(dims.collect())
            }
            Op::LooMean { x, axis } => {
                let s = shape(x);
                if axis >= s.rank() {
                    return err(Rank, format!("axis {axis} is out of range for {s}"));
                }
                s
            }
            Op::Where { cond, a, b } => {
                let mismatch = |m| ShapeError { kind: Mismatch, message: format!("`where`: {m}") };
                let ab = broadcast(&shape(a), &shape(b)).map_err(mismatch)?;
                broadcast(&shape(cond), &ab).map_err(mismatch)?
            }
            Op::MixCols { y, alpha } => {
                let (sy, sa) = (shape(y), shape(alpha));
                want_min_rank("the operand of a column mix", &sy, 1)?;
                want_rank("the mixing coefficients", &sa, 3)?;
                let (Some(m), Some(h), Some(p)) = (sa.0[0].as_known(), sa.0[1].as_known(), sa.0[2].as_known()) else {
                    return err(NotDivisible, format!("mixing coefficients {sa} must have known sizes"));
                };
                let Some(d) = sy.back(1).div_exact(m) else {
                    return err(NotDivisible, format!("the last axis of {sy} does not split into {m} heads"));
                };
                let mut out = sy.0.clone();
                *out.last_mut().unwrap() = d.mul(&Dim::known(h * p)).unwrap();
                Shape(out)
            }
            Op::CollapseCols { y, r } => {
                let (sy, sr) = (shape(y), shape(r));
                want_min_rank("the operand of a column collapse", &sy, 1)?;
                want_rank("the collapse matrix", &sr, 2)?;
                let (Some(h), Some(c)) = (sr.0[0].as_known(), sr.0[1].as_known()) else {
                    return err(NotDivisible, format!("collapse matrix {sr} must have known sizes"));
                };
                let Some(d) = sy.back(1).div_exact(c) else {
                    return err(NotDivisible, format!("the last axis of {sy} does not split into {c} pseudo-heads"));
                };
                let mut out = sy.0.clone();
                *out.last_mut().unwrap() = d.mul(&Dim::known(h)).unwrap();
                Shape(out)
            }
            Op::CollapseRows { w, r } => {
                let (sw, sr) = (shape(w), shape(r));
                want_rank("the projection", &sw, 2)?;
                want_rank("the collapse matrix", &sr, 2)?;
                let (Some(h), Some(c)) = (sr.0[0].as_known(), sr.0[1].as_known()) else {
                    return err(NotDivisible, format!("collapse matrix {sr} must have known sizes"));
                };
                let Some(d) = sw.0[0].div_exact(h) else {
                    return err(NotDivisible, format!("the rows of {sw} do not split into {h} heads"));
                };
                Shape(vec![d.mul(&Dim::known(c)).unwrap(), sw.0[1].clone()])
            }
            Op::UnflattenHeads { x, pseudo } => {
                let s = shape(x);
                want_rank("the operand of `unflatten_heads`", &s, 4)?;
                let Some(h) = s.0[1].div_exact(pseudo) else {
                    return err(NotDivisible, format!("the head axis of {s} is not a multiple of {pseudo}"));
                };
                Shape(vec![s.0[0].clone(), h, Dim::known(pseudo), s.0[2].clone(), s.0[3].clone()])
            }
            Op::FlattenHeads { x } => {
                let s = shape(x);
                want_rank("the operand of `flatten_heads`", &s, 5)?;
                let hp = s.0[1].mul(&s.0[2]).ok_or(ShapeError { kind: BadSize, message: "size overflow".into() })?;
                Shape(vec![s.0[0].clone(), hp, s.0[3].clone(), s.0[4].clone()])
            }
            Op::ConcatCols { a, b } => {
                let (sa, sb) = (shape(a), shape(b));
                want_min_rank("a concatenated operand", &sa, 1)?;
                let same_rows = sa.rank() == sb.rank() && sa.0[..sa.rank() - 1] == sb.0[..sb.rank() - 1];
                match (sa.back(1).as_known(), sb.back(1).as_known()) {
                    (Some(x), Some(y)) if same_rows => {
                        let mut out = sa.0.clone();
                        *out.last_mut().unwrap() = Dim::known(x + y);
                        Shape(out)
                    }
                    _ => return err(Mismatch, format!("cannot concatenate the columns of {sa} and {sb}")),
                }
            }
            Op::Concat { a, b, axis } => {
                let (sa, sb) = (shape(a), shape(b));
                let others_equal = sa.rank() == sb.rank() && (0..sa.rank()).all(|k| k == axis || sa.0[k] == sb.0[k]);
                if axis >= sa.rank() || !others_equal {
                    return err(
                        Mismatch,
                        format!("cannot concatenate {sa} and {sb} along axis {axis}: every other axis must be equal"),
                    );
                }
                let mut out = sa.0.clone();
                out[axis] = sa.0[axis].add(&sb.0[axis]);
                Shape(out)
            }
            Op::Slice { x, axis, ref len, .. } => {
                let s = shape(x);
                if axis >= s.rank() {
                    return err(Rank, format!("axis {axis} is out of range for {s}"));
                }
                let mut out = s.0.clone();
                out[axis] = len.clone();
                Shape(out)
            }
            Op::SliceCols { x, start, len } => {
                let s = shape(x);
                want_min_rank("a sliced tensor", &s, 1)?;
                match s.back(1).as_known() {
                    Some(f) if len >= 1 && start.checked_add(len).is_some_and(|end| end <= f) => {
                        let mut out = s.0.clone();
                        *out.last_mut().unwrap() = Dim::known(len);
                        Shape(out)
                    }
                    _ => return err(Mismatch, format!("columns {start}..{} are out of range for {s}", start + len)),
                }
            }
            Op::Thresholds { x, levels } => {
                if levels < 2 {
                    return err(BadSize, format!("an ordinal decomposition needs at least 2 levels, not {levels}"));
                }
                let mut s = shape(x);
                s.0.push(Dim::known(levels - 1));
                s
            }
        })
    }
}

/// The softmax and output head counts of attention over `hq` query heads:
/// `hq` both without head mixing; else the columns of `mix_logits`
/// (`[hq, H_s]`) and of `mix_probs` (`[H_s, H_o]`).
fn mixed_heads(
    fns: &Option<Box<AttnFns>>,
    hq: &Dim,
    shape: &dyn Fn(NodeId) -> Shape,
) -> Result<(Dim, Dim), ShapeError> {
    let Some(f) = fns.as_deref() else { return Ok((hq.clone(), hq.clone())) };
    let matrix = |c: Option<usize>, rows: Dim, what: &str, cols: &str| -> Result<Dim, ShapeError> {
        let Some(c) = c else { return Ok(rows) };
        let s = shape(f.captures[c]);
        if s.rank() != 2 || s.0[0] != rows || s.0[1].as_known().is_none_or(|n| n == 0) {
            return err(ShapeErrorKind::Mismatch, format!("{what} must have shape [{rows}, {cols}], not {s}"));
        }
        Ok(s.0[1].clone())
    };
    let hs = matrix(f.mix.logits, hq.clone(), "mix_logits (query heads × softmax heads)", "H_s")?;
    let ho = matrix(f.mix.probs, hs.clone(), "mix_probs (softmax heads × output heads)", "H_o")?;
    if let Some(c) = f.sink {
        let s = shape(f.captures[c]);
        if s.rank() != 1 || s.0[0] != *hq {
            return err(
                ShapeErrorKind::Mismatch,
                format!("sink (a logit per query head) must have shape [{hq}], not {s}"),
            );
        }
    }
    Ok((hs, ho))
}
