//! Diagnostics: a code, a message, labelled spans and notes; rendered through
//! codespan-reporting without colour so that snapshots compare plain text.

use crate::codes::Code;
use attnc_grammar::ast::Span;
use codespan_reporting::diagnostic as cs;
use codespan_reporting::files::SimpleFile;
use codespan_reporting::term;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    Error,
    Warning,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    pub severity: Severity,
    pub code: Code,
    pub message: String,
    /// The primary location and its label; `None` for errors about the command line.
    pub primary: Option<(Span, String)>,
    pub secondary: Vec<(Span, String)>,
    /// Hints and notes, printed after the source excerpt.
    pub notes: Vec<String>,
}

impl Diagnostic {
    pub fn error(code: Code, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            severity: Severity::Error,
            code,
            message: message.into(),
            primary: None,
            secondary: vec![],
            notes: vec![],
        }
    }
    pub fn warning(code: Code, message: impl Into<String>) -> Diagnostic {
        Diagnostic { severity: Severity::Warning, ..Diagnostic::error(code, message) }
    }
    pub fn at(mut self, span: Span, label: impl Into<String>) -> Diagnostic {
        self.primary = Some((span, label.into()));
        self
    }
    pub fn with(mut self, span: Span, label: impl Into<String>) -> Diagnostic {
        self.secondary.push((span, label.into()));
        self
    }
    pub fn hint(mut self, note: impl Into<String>) -> Diagnostic {
        self.notes.push(format!("hint: {}", note.into()));
        self
    }
    pub fn note(mut self, note: impl Into<String>) -> Diagnostic {
        self.notes.push(format!("note: {}", note.into()));
        self
    }
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

/// Sort by position (command-line errors first), as users read top to bottom.
pub fn sort(diags: &mut [Diagnostic]) {
    diags.sort_by_key(|d| (d.primary.as_ref().map(|(s, _)| (s.start, s.end)), d.severity));
}

/// Render diagnostics as plain text, `file:line:col` on each, no colour.
pub fn render(file_name: &str, source: &str, diags: &[Diagnostic]) -> String {
    let file = SimpleFile::new(file_name, source);
    let config = term::Config::default();
    let mut out = term::termcolor::NoColor::new(Vec::new());
    for d in diags {
        let mut labels = Vec::new();
        if let Some((span, label)) = &d.primary {
            labels.push(cs::Label::primary((), clamp(*span, source)).with_message(label));
        }
        for (span, label) in &d.secondary {
            labels.push(cs::Label::secondary((), clamp(*span, source)).with_message(label));
        }
        let base = match d.severity {
            Severity::Error => cs::Diagnostic::error(),
            Severity::Warning => cs::Diagnostic::warning(),
        };
        let diag =
            base.with_code(d.code.as_str()).with_message(&d.message).with_labels(labels).with_notes(d.notes.clone());
        term::emit(&mut out, &config, &file, &diag).expect("writing to a Vec cannot fail");
    }
    String::from_utf8(out.into_inner()).expect("codespan writes UTF-8")
}

/// Spans are byte offsets into `source`; keep them on char boundaries.
fn clamp(span: Span, source: &str) -> std::ops::Range<usize> {
    let fix = |mut i: usize| {
        i = i.min(source.len());
        while !source.is_char_boundary(i) {
            i -= 1;
        }
        i
    };
    fix(span.start)..fix(span.end.max(span.start))
}

/// Levenshtein distance, for "did you mean" suggestions.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

/// The candidate closest to `name`, if close enough to be a likely typo.
pub fn suggest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let limit = (name.chars().count() / 3).max(1);
    candidates
        .into_iter()
        .map(|c| (distance(&name.to_lowercase(), &c.to_lowercase()), c))
        .filter(|(d, _)| *d <= limit)
        .min()
        .map(|(_, c)| c)
}
