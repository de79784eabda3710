//! Split-KV decoding (FlashDecoding, Dao et al. 2023): an attention launch
//! with few query rows and many keys gives a GPU too few cubes (one per
//! batch and head at a decode step: 8 for B·H = 8 on 132 SMs).
//! [`Plan::split_kv`] splits such a launch's keys into chunks on the grid's
//! z axis; each chunk's cube writes its rows' partial output and
//! log-sum-exp, and a [`KernelSpec::Combine`] launch merges the chunks:
//! `o = Σ_z e^{lse_z − m} o_z / Σ_z e^{lse_z − m}`, `m = max_z lse_z`.
//! Partial values are stored as two parts (`hi` rounded to the storage
//! type, `lo` the rest), so 16-bit storage keeps f32's precision.

use super::{push_buffer, BufferRole, KernelSpec, Launch, Plan, RowView};
use crate::ir::Weights;
use serde::Serialize;

/// How an attention launch's keys are split (`KernelSpec::Attention::kv`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct KvSplit {
    /// Chunks of keys, the grid's z.
    pub splits: usize,
    /// Keys per chunk (the last may be shorter): a multiple of
    /// [`SPLIT_KEYS`], so that every key tile divides it.
    pub keys: usize,
    /// Floats of one partial row: its output's `hi` parts (`e` floats), its
    /// `lo` parts, then the log-sum-exp's `hi` and `lo`, each a vector of
    /// `lanes` floats (`NO_KEYS` in `hi` for a chunk the row sees no key of).
    pub row: usize,
    /// The attention launch's vector width.
    pub lanes: usize,
}

/// Keys per chunk are a multiple of this (every key tile divides it).
pub const SPLIT_KEYS: usize = 256;

/// Query rows a cube at the finest tiling (`AttnTiles::cube_rows`).
const FINEST_CUBE_ROWS: usize = 32;

/// The most chunks one launch is split into.
pub const MAX_SPLITS: usize = 64;

impl Plan {
    /// The same plan with each attention launch that gives a device of
    /// `units` compute units (SMs) fewer than `2 · units` cubes (counted at
    /// 32 query rows a cube, the finest tiling) split over
    /// its keys, into as many chunks of at least [`SPLIT_KEYS`] keys as make
    /// up the difference (at most [`MAX_SPLITS`]), plus a combine launch.
    /// Split launches run on the scalar kernels (not on matrix fragments).
    pub fn split_kv(mut self, units: usize) -> Plan {
        let mut launches = Vec::with_capacity(self.launches.len());
        for l in std::mem::take(&mut self.launches) {
            let Some(kv) = choose(&l.spec, units) else {
                launches.push(l);
                continue;
            };
            let KernelSpec::Attention { shape, out, .. } = &l.spec else { unreachable!("`choose` takes attention") };
            let (batch, h, s, e) = (shape.batch, shape.h, shape.s, shape.e);
            let rows = batch * h * s;
            let partial = push_buffer(&mut self.buffers, &[kv.splits, rows, kv.row], BufferRole::Temp);
            let fns = shape.fns.as_ref();
            let (weights, sink) = (fns.map_or(Weights::Softmax, |f| f.weights), fns.and_then(|f| f.sink));
            let combine = KernelSpec::Combine { batch, h, s, e, kv, out: *out, weights, sink: sink.is_some() };
            let mut spec = l.spec.clone();
            if let KernelSpec::Attention { out, kv: split, .. } = &mut spec {
                *out = RowView {
                    offset: 0,
                    batch: h * s * kv.row,
                    head: s * kv.row,
                    block: 1,
                    outer: kv.row,
                    inner: kv.row,
                };
                *split = Some(kv);
            }
            let partial_bytes = (kv.splits * rows * kv.row * self.dtype.size()) as f64;
            let out_buf = *l.bindings.last().expect("an output");
            let mut bindings = l.bindings.clone();
            *bindings.last_mut().expect("an output") = partial;
            let prepare = l.prepare;
            launches.push(Launch { spec, bindings, frees: vec![], bytes: l.bytes + partial_bytes, ..l.clone() });
            let frees = l.frees.iter().copied().chain([partial]).collect();
            let bytes = partial_bytes + (rows * e * self.dtype.size()) as f64;
            let merge = 4.0 * (kv.splits * rows * e) as f64;
            let spec = combine;
            launches.push(Launch {
                name: String::new(),
                spec,
                // The sink: a capture, bound after q, k and v.
                bindings: [partial].into_iter().chain(sink.map(|c| l.bindings[3 + c])).chain([out_buf]).collect(),
                frees,
                flops: merge,
                bytes,
                prepare,
            });
        }
        self.launches = launches;
        // Split launches run on the scalar kernels (`path::choose`).
        self.choose_paths();
        for (i, l) in self.launches.iter_mut().enumerate() {
            l.name = super::launch_name(&self.spec, i, &l.spec);
        }
        self
    }
}

/// The split of an attention launch that gives fewer than `2 · units`
/// cubes, if it has the keys to share.
fn choose(spec: &KernelSpec, units: usize) -> Option<KvSplit> {
    // A forward that also writes the backward's log-sum-exp is a training
    // step's, with queries enough: it is not split.
    let KernelSpec::Attention { shape, kv: None, lse: false, .. } = spec else { return None };
    if spec.fold_x() != 0 {
        return None;
    }
    // Cubes at the finest tiling any device uses (32 query rows a cube,
    // CUDA's register tiles at 8 lanes a row): a prefill has plenty.
    let cubes = shape.s.div_ceil(FINEST_CUBE_ROWS) * shape.batch * shape.h;
    let want = (2 * units).div_ceil(cubes.max(1));
    let splits = want.min(shape.sk.div_ceil(SPLIT_KEYS)).min(MAX_SPLITS);
    let keys = shape.sk.div_ceil(splits.max(1)).div_ceil(SPLIT_KEYS) * SPLIT_KEYS;
    let splits = shape.sk.div_ceil(keys);
    let lanes = spec.line_size();
    (splits >= 2).then_some(KvSplit { splits, keys, row: 2 * shape.e + 2 * lanes, lanes })
}
