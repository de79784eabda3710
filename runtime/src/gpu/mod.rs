//! The CubeCL backend. **API Boundary:** every use of cubecl is in this
//! folder, so its API changes touch nothing else.
//!
//! - `plan.rs` — IR → launches (plain data, no device);
//! - `group.rs` — reward estimators' per-group work fused into one launch
//!   per pass, ODRPO's threshold split in cumulative-count form;
//! - `kernels.rs` — the `#[cube]` kernel bodies and helpers;
//! - `attention.rs`, `gemm.rs` — the tiled kernels, assembled from helpers;
//! - `define.rs` — a plan launch → a cubecl kernel definition.

pub mod attention;
pub mod baseline;
pub mod bench;
pub mod define;
pub mod emit;
pub mod exec;
pub mod gemm;
pub mod group;
pub mod kernels;
pub mod plan;
