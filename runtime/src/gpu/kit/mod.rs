//! The attention kernel kit: each concern every attention kernel shares,
//! written once, as FlashAttention-3's `hopper/` writes its `mask.h`,
//! `softmax.h` and `block.h` once for every mainloop.
//! - `launch.rs` — [`launch::Dims`], a launch's compile-time description;
//! - `mask.rs` — built-in mask semantics: visibility, the key band of a
//!   block of queries and the query band of a block of keys, tiles;
//! - `weights.rs` — which normaliser a launch uses (`Norm`: softmax, with
//!   a sink, sigmoid, linear, hard);
//! - `norm.rs` — the normaliser: online state, update, finish, the row
//!   statistic stored and read, each weighting's `dS`, the sentinels, the
//!   split-KV combine, the sink's gradient;
//! - `walk.rs` — the tile walks, over keys and over queries;
//! - `source.rs` — where rows are: views, contiguous or paged keys and values;
//! - `bands.rs` (a test) — the mask's bands on the device against the IR's
//!   definition and the tile functions of the same mask lowered.
//!
//! The kernels (`attention_*.rs`, `mma/flash*.rs`) are mainloops: data
//! movement, products and the order of steps.

pub mod launch;
pub mod mask;
pub mod norm;
pub mod pair;
pub mod source;
pub mod walk;
pub mod weights;

#[cfg(test)]
mod bands;
