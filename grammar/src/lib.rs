//! The `.attn` front end: a pest grammar, an AST with spans, and a printer
//! back to canonical text.
//!
//! **Architecture Invariant:** this crate knows nothing of the IR, of builtin
//! functions or of parameter meanings. It turns text into trees and back.

pub mod ast;
mod format;
mod parse;
mod print;

pub use format::{comments, format_spec, Comment};
pub use parse::{parse, parse_expr, SyntaxError, SyntaxErrorKind, MAX_EXPR_DEPTH, MAX_NESTING, MAX_SOURCE_BYTES};
pub use print::{print_expr, print_spec, print_type};
