//! An attention launch's compile-time description: one type for every
//! attention kernel, forward and backward, plain, mixing and reading,
//! built from the plan's `AttnShape` by [`Dims::of`].

use super::mask::{mask_code, Mask};
use super::weights::Norm;
use crate::gpu::func::Fns;
use crate::gpu::kernels::Vecs;
use crate::gpu::kernels::{self as k, Stored};
use attnc_compiler::plan::{AttnShape, AttnTiles, RowView};
use cubecl::prelude::*;

/// The comptime sizes of an attention launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Dims {
    /// Query heads and key/value heads.
    pub h: usize,
    pub hk: usize,
    /// Query rows and key rows.
    pub s: usize,
    pub sk: usize,
    /// Key and value widths.
    pub d: usize,
    pub e: usize,
    /// The built-in mask (`mask::MASK_*`), its window (0: none) and block.
    pub kind: u32,
    pub window: usize,
    pub block: usize,
    /// Rows per tile of the side a cube walks.
    pub tile: usize,
    /// `KernelSpec::fold_x`.
    pub fold: usize,
    /// Units sharing each row, lanes of one plane, each holding the row's
    /// channels `c · lanes + lane` (register tiling; 1: a unit a row).
    pub lanes: usize,
    /// Rows per cube.
    pub rows: usize,
    /// How scores become weights.
    pub norm: Norm,
}

impl Dims {
    /// The description of a launch of `shape`: tiles of `tile` rows, `rows`
    /// rows a cube shared by `lanes` lanes each, grid folded by `fold`.
    pub fn of(shape: &AttnShape, tile: usize, rows: usize, lanes: usize, fold: usize) -> Dims {
        let AttnShape { h, hk, s, sk, d, e, mask, window, block, .. } = *shape;
        let (kind, norm) = (mask_code(mask), Norm::of(shape.fns.as_ref()));
        Dims { h, hk, s, sk, d, e, kind, window: window.unwrap_or(0), block, tile, fold, lanes, rows, norm }
    }

    /// The built-in mask.
    pub fn mask(&self) -> Mask {
        Mask { kind: self.kind, window: self.window, block: self.block, s: self.s, sk: self.sk }
    }

    /// Units per cube.
    pub fn units(&self) -> usize {
        self.rows * self.lanes
    }
}

/// Slots of a unit's row array (`attention::row_slots`): the addresses of
/// its query and output rows and its query row's index.
pub const ROW_Q: usize = 0;
pub const ROW_OUT: usize = 1;
pub const ROW_I: usize = 2;

/// A host-assembled attention launch (`attention_tiled`, `attention_split`,
/// `attention_tiled_grad`, `mma::flash`, `mma::flash_grad`): its [`Dims`]
/// and what else the plan says of it.
pub struct Shape {
    /// Sizes and mask; `tile` is the key tile, `rows` the cube's query rows.
    pub g: Dims,
    /// Layouts of q, k, v and the output, strides in vectors.
    pub views: [RowView; 4],
    /// Floats a vector of the bindings.
    pub lanes: usize,
    pub tiles: AttnTiles,
    /// 16-bit storage (each load also converts).
    pub half: bool,
    /// Score and mask functions and the tensors they read.
    pub fns: Option<Fns>,
    /// Split-KV decoding (`plan::KvSplit`), in the kernel's units.
    pub kv: Option<Split>,
    /// Keys and values in a paged cache, and its block table.
    pub paged: Option<Paged>,
    /// Where to write each query row's log-sum-exp beside its output
    /// (`plan::KernelSpec::Attention::lse`, for the backward), row-major `[B, H, S]`.
    pub lse: Option<NativeExpand<[Stored]>>,
}

impl Shape {
    /// The built-in mask.
    pub fn mask(&self) -> Mask {
        self.g.mask()
    }

    /// The cube's batch and head.
    pub fn cube_head(&self, scope: &Scope) -> (NativeExpand<usize>, NativeExpand<usize>) {
        let bh = k::cube_y::expand(scope, self.g.fold);
        (k::idx_div::expand(scope, bh, self.g.h), k::idx_mod::expand(scope, bh, self.g.h))
    }
}

/// A host-assembled attention launch's query, key and value bindings.
pub struct Inputs<'a, N: Size> {
    pub q: &'a Vecs<N>,
    pub k: &'a Vecs<N>,
    pub v: &'a Vecs<N>,
}

/// A paged cache read in place (`plan::PagedRows`): its block table (a
/// binding after the captures) and the elements an entry takes.
pub struct Paged {
    pub rows: attnc_compiler::plan::PagedRows,
    pub table: NativeExpand<[Stored]>,
    pub digits: usize,
}

impl Paged {
    /// The cache's comptime layout.
    pub fn pages(&self) -> k::Pages {
        let r = self.rows;
        k::Pages { page: r.page, slots: r.slots, blocks: r.blocks, digits: self.digits }
    }
}

/// A split-KV launch's chunks in a kernel's units: key tiles per chunk,
/// and, in vectors, the chunks' stride in the partial output and the
/// offsets within a partial row of its `lo` parts and its log-sum-exp.
#[derive(Clone, Copy)]
pub struct Split {
    pub tiles: usize,
    pub stride: usize,
    pub lo: usize,
    pub lse: usize,
}
