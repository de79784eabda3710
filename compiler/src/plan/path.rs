//! The attention kernel a launch runs, and its tiling: one enum
//! ([`AttnPath`]), one rule ([`choose`]) and one writer of the launch's
//! flags ([`KernelSpec::set_path`]). The passes whose inputs change the
//! choice — the storage type ([`Plan::in_dtype`]), split-KV decoding
//! ([`Plan::split_kv`]) and the device's planes ([`Plan::on_planes`]) —
//! each make it again by this rule; none writes a flag of its own.

use super::tiles::{frag_grad_tiles, frag_key_tile, REGISTER_FLOATS};
use super::{Dtype, KernelSpec, Plan};
use crate::ir::AttnArg;

/// The attention kernel an attention launch runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttnPath {
    /// The CPU drivers' tiling: several whole rows a unit in vectors, the
    /// other side's tiles unrolled (`gpu::attention_tiled`, its
    /// log-sum-exp launch too, and `gpu::attention_tiled_grad`).
    Tiled,
    /// Within a GPU's register file: this many lanes of one plane share
    /// each row, each holding a slice of its channels
    /// (`gpu::attention_split`; the log-sum-exp and the backward on
    /// `gpu::attention_grad`'s `#[cube]` kernels).
    Lanes(usize),
    /// Matrix fragments, one row a unit (`gpu::mma::flash`,
    /// `gpu::mma::flash_grad`; in software where the device has none).
    Fragments,
}

/// The path of attention launch `spec` in a plan of `dtype` on a device
/// whose planes have `plane` lanes (`None`: the CPU drivers, which tile
/// whole rows): matrix fragments for 16-bit storage (and TF32's dQ, dK and
/// dV) where the heads fit fragment tiles and the keys are not split; else
/// lanes sharing each row on a device with planes; else the CPU drivers'
/// tiling. `None` for a launch that is not attention's.
pub fn choose(spec: &KernelSpec, dtype: Dtype, plane: Option<usize>) -> Option<AttnPath> {
    let lanes = spec.line_size();
    let fragments = match *spec {
        KernelSpec::Attention { ref shape, kv, .. } => {
            dtype.is_half() && frag_key_tile(shape.d, shape.e, lanes).is_some() && kv.is_none()
        }
        KernelSpec::AttentionGrad { ref shape, wrt, .. } => {
            let multiplies = dtype.is_half() || dtype == Dtype::Tf32;
            let rows = matches!(wrt, AttnArg::Q | AttnArg::K | AttnArg::V);
            multiplies && rows && frag_grad_tiles(shape.d, shape.e, dtype.storage().size()).is_some()
        }
        KernelSpec::AttentionLse { .. } => false,
        _ => return None,
    };
    Some(match (fragments, plane) {
        (true, _) => AttnPath::Fragments,
        (false, Some(plane)) => AttnPath::Lanes(fit_lanes(spec, plane)),
        (false, None) => AttnPath::Tiled,
    })
}

/// Lanes sharing each row so that a unit holds at most [`REGISTER_FLOATS`]
/// of it: the narrowest count that splits both rows evenly within a plane,
/// else the widest there is.
fn fit_lanes(spec: &KernelSpec, plane: usize) -> usize {
    // The row as the CPU drivers' tiling holds it (no lanes, no fragments):
    // `line_size` and `row_floats` read the flags, and a launch already
    // split (chosen again) must not count its own lanes.
    let mut scalar = spec.clone();
    scalar.set_path(AttnPath::Tiled, Dtype::F32);
    let Some(super::RowFloats { held, widths: (a, b), widest, .. }) = scalar.row_floats() else { return 1 };
    let counts: Vec<usize> = [1, 2, 4, 8, 16]
        .into_iter()
        .filter(|g| a % g == 0 && b % g == 0 && *g <= plane.max(1) && *g <= widest)
        .collect();
    counts.iter().copied().find(|g| held / g <= REGISTER_FLOATS).unwrap_or(*counts.last().expect("1 divides"))
}

impl KernelSpec {
    /// The attention kernel this launch runs ([`choose`]'s choice, as its
    /// flags record it); `None` for a launch that is not attention's.
    pub fn path(&self) -> Option<AttnPath> {
        let (fragments, split) = match *self {
            KernelSpec::Attention { fragments, split, .. } | KernelSpec::AttentionGrad { fragments, split, .. } => {
                (fragments, split)
            }
            KernelSpec::AttentionLse { split, .. } => (false, split),
            _ => return None,
        };
        Some(match (fragments, split) {
            (true, _) => AttnPath::Fragments,
            (false, 0) => AttnPath::Tiled,
            (false, lanes) => AttnPath::Lanes(lanes),
        })
    }

    /// Record `path` in the launch's flags (`fragments`, `split`, and the
    /// backward's `tf32`, the fragments' operand type in a plan of `dtype`):
    /// the one place they are written.
    pub(super) fn set_path(&mut self, path: AttnPath, dtype: Dtype) {
        let frags = path == AttnPath::Fragments;
        let lanes = match path {
            AttnPath::Lanes(n) => n,
            _ => 0,
        };
        match self {
            KernelSpec::Attention { fragments, split, .. } => (*fragments, *split) = (frags, lanes),
            KernelSpec::AttentionGrad { fragments, split, tf32, .. } => {
                (*fragments, *split, *tf32) = (frags, lanes, frags && dtype == Dtype::Tf32)
            }
            KernelSpec::AttentionLse { split, .. } => *split = lanes,
            _ => {}
        }
    }

    /// This launch as a device whose planes have `plane` lanes runs it
    /// (register tiling where it is not on fragments; any other launch unchanged).
    pub fn on_planes(&self, dtype: Dtype, plane: Option<usize>) -> KernelSpec {
        let mut spec = self.clone();
        if let Some(path) = choose(self, dtype, plane) {
            spec.set_path(path, dtype);
        }
        spec
    }
}

impl Plan {
    /// The plan as a device whose planes have `plane` lanes runs it: every
    /// attention launch's path chosen again ([`choose`]) for it.
    pub fn on_planes(mut self, plane: Option<usize>) -> Plan {
        for l in &mut self.launches {
            l.spec = l.spec.on_planes(self.dtype, plane);
        }
        self
    }

    /// Each attention launch's path chosen again for the plan's storage
    /// type, on the CPU drivers' tiling ([`choose`] without planes), as
    /// [`Plan::in_dtype`] and [`Plan::split_kv`] leave it.
    pub(super) fn choose_paths(&mut self) {
        let dtype = self.dtype;
        for l in &mut self.launches {
            let Some(path) = choose(&l.spec, dtype, None) else { continue };
            // The fragment dK/dV kernel walks every query tile of the mask's band:
            // a mask function's tiles are not skipped there, so not priced so.
            let kv_grad = matches!(l.spec, KernelSpec::AttentionGrad { wrt: AttnArg::K | AttnArg::V, .. });
            let was = l.spec.path() == Some(AttnPath::Fragments);
            let now = path == AttnPath::Fragments;
            if kv_grad && now != was {
                let visited = super::visited::visited_fraction(&l.spec);
                l.flops = if now { l.flops / visited } else { l.flops * visited };
            }
            l.spec.set_path(path, dtype);
        }
    }
}
