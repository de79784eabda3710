//! One module per command family; each takes its parsed arguments (`args.rs`)
//! and the [`Ui`], and reports failures on stderr before returning [`Failed`].
//! What they share: reading a spec through the library pipeline and
//! reporting errors with their codes.

pub mod bench;
pub mod check;
pub mod compile;
pub mod grad;
pub mod inspect;
pub mod run;
mod sweep;

use crate::progress::Ui;
use attnc::{Compiler, Error as PipelineError, Program};
use attnc_compiler::Code;
use std::path::Path;

/// The command failed and has already said why on stderr.
pub struct Failed;

pub fn report(code: Code, message: impl std::fmt::Display) -> Failed {
    eprintln!("error[{}]: {message}", code.as_str());
    Failed
}

/// A pipeline error, reported with its code.
pub fn fail(e: PipelineError) -> Failed {
    report(e.code(), e)
}

pub fn read_source(file: &Path) -> Result<String, Failed> {
    std::fs::read_to_string(file).map_err(|e| report(Code::Io, format_args!("cannot read `{}`: {e}", file.display())))
}

/// Compile a file through the library pipeline, printing its diagnostics
/// (warnings included).
pub fn program(file: &Path, set: &[String], ui: &Ui) -> Result<Program, Failed> {
    let name = file.display().to_string();
    let _step = ui.step(format!("compiling {name}"));
    let compiler = Compiler::new(&name, read_source(file)?);
    let compiled = compiler.settings(set).map_err(fail)?.compile();
    match compiled {
        Ok(p) => {
            eprint!("{}", p.warnings());
            Ok(p)
        }
        Err(PipelineError::Spec { diagnostics, rendered }) => {
            eprint!("{rendered}");
            let errors = diagnostics.iter().filter(|d| d.is_error()).count();
            eprintln!("error: `{name}` has {errors} error{}", if errors == 1 { "" } else { "s" });
            Err(Failed)
        }
        Err(e) => Err(fail(e)),
    }
}

/// Whether two paths name one file (an output must not overwrite an input).
pub fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

/// Refuses `--out` when it is one of the files read.
pub fn not_an_input(out: &Path, inputs: &[Option<&Path>], what: &str) -> Result<(), Failed> {
    if inputs.iter().flatten().any(|path| same_file(path, out)) {
        let message = format_args!("--out `{}` is {what}; refusing to overwrite it", out.display());
        return Err(report(Code::TensorFile, message));
    }
    Ok(())
}
