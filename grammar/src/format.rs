//! `attnc fmt`: the canonical text of a spec with its author's comments and
//! paragraph breaks kept.
//!
//! The parser drops comments (they are pest's implicit `COMMENT`), so they
//! are recovered here by a lexical scan of the source — which only has to
//! know string literals, since a spec that parsed has no other token that can
//! hold `#` or `//` — and attached to the items by position:
//! - a comment that ends a line holding code *trails* the item (or header)
//!   that line belongs to, and stays at the end of its line;
//! - every other comment *leads* the next item and is printed on its own
//!   lines above it; comments after the last item end the file.
//!
//! A comment inside a multi-line item leads that item (items print on one
//! line). A blank line is kept before an item (above its leading comments)
//! where the source had one, and added where the kind of item changes, as
//! [`print_spec`](crate::print_spec) does. Trailing comments of consecutive
//! lines are aligned one column past the longest code among them.
//!
//! Formatting is idempotent: `format(format(x)) == format(x)`, and it keeps
//! every comment's text.

use crate::ast::{Span, Spec};
use crate::print::print_item;

/// A comment's text (from `//` or `#` to the end of its line, trailing
/// whitespace removed) and where it starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Comment {
    pub text: String,
    pub start: usize,
}

/// Every comment of `source`, in order.
pub fn comments(source: &str) -> Vec<Comment> {
    let bytes = source.as_bytes();
    let mut out = vec![];
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                // A string ends at its closing quote or, unterminated, at the line's end.
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' && bytes[i] != b'\n' {
                    i += 1;
                }
                i += 1;
            }
            b'#' | b'/' if bytes[i] == b'#' || bytes.get(i + 1) == Some(&b'/') => {
                let end = source[i..].find('\n').map_or(source.len(), |n| i + n);
                out.push(Comment { text: source[i..end].trim_end().to_string(), start: i });
                i = end;
            }
            _ => i += 1,
        }
    }
    out
}

/// One printed line of code with the comments that go with it.
struct Line {
    leading: Vec<String>,
    code: String,
    trailing: Option<String>,
    /// A blank line goes before this line's leading comments.
    blank_before: bool,
}

/// Where the code of `source` starts: past leading whitespace and comments.
fn code_start(source: &str, comments: &[Comment]) -> usize {
    let mut at = 0;
    loop {
        at += source[at..].len() - source[at..].trim_start().len();
        match comments.iter().find(|c| c.start == at) {
            Some(c) => at += c.text.len(),
            None => return at,
        }
    }
}

/// `span` without the whitespace and comments pest's implicit skipping may
/// have taken in at its end (before an optional part that was absent).
fn code_span(source: &str, span: Span, comments: &[Comment]) -> Span {
    let mut end = span.end;
    loop {
        end = span.start + source[span.start..end].trim_end().len();
        match comments.iter().find(|c| c.start >= span.start && c.start + c.text.len() == end) {
            Some(c) => end = c.start,
            None => return Span::new(span.start, end),
        }
    }
}

/// Is there a blank line in `gap`, the text between two items that holds
/// at most the first one's trailing comment?
fn has_blank_line(gap: &str) -> bool {
    gap.split_once('\n').is_some_and(|(_, rest)| rest.contains('\n'))
}

/// The formatted text of `source`, which parsed to `spec`.
pub fn format_spec(source: &str, spec: &Spec) -> String {
    let all = comments(source);
    // Code spans in order: the header, then each item.
    let header = Span::new(code_start(source, &all), spec.name.span.end);
    let spans: Vec<Span> =
        std::iter::once(header).chain(spec.items.iter().map(|i| code_span(source, i.span, &all))).collect();
    let mut lines: Vec<Line> = std::iter::once(format!("spec {}", spec.name.name))
        .chain(spec.items.iter().map(|item| {
            let mut s = String::new();
            print_item(&item.kind, &mut s);
            s
        }))
        .map(|code| Line { leading: vec![], code, trailing: None, blank_before: false })
        .collect();
    // Where each line's text begins in the source: its first own-line comment, or its code.
    let mut begins: Vec<usize> = spans.iter().map(|s| s.start).collect();
    let mut closing = vec![];
    for c in all {
        let line_start = source[..c.start].rfind('\n').map_or(0, |n| n + 1);
        let after_code = !source[line_start..c.start].trim().is_empty();
        match spans.iter().rposition(|s| s.start < c.start) {
            Some(i) if after_code && spans[i].end <= c.start => lines[i].trailing = Some(c.text),
            // Inside a multi-line item: leads it.
            Some(i) if c.start < spans[i].end => lines[i].leading.push(c.text),
            _ => match spans.iter().position(|s| s.start > c.start) {
                Some(next) => {
                    begins[next] = begins[next].min(c.start);
                    lines[next].leading.push(c.text)
                }
                None => closing.push(c.text),
            },
        }
    }
    for i in 1..lines.len() {
        let kind_changes = i == 1
            || std::mem::discriminant(&spec.items[i - 1].kind) != std::mem::discriminant(&spec.items[i - 2].kind);
        let gap = source.get(spans[i - 1].end..begins[i]).unwrap_or("");
        lines[i].blank_before = kind_changes || has_blank_line(gap);
    }
    let mut out = String::new();
    let mut run_start = 0;
    while run_start < lines.len() {
        // A run: consecutive lines with no blank line or comment line between.
        let mut run_end = run_start + 1;
        while run_end < lines.len() && !lines[run_end].blank_before && lines[run_end].leading.is_empty() {
            run_end += 1;
        }
        let run = &lines[run_start..run_end];
        let column = run.iter().filter(|l| l.trailing.is_some()).map(|l| l.code.chars().count()).max().unwrap_or(0) + 2;
        for l in run {
            if l.blank_before {
                out.push('\n');
            }
            for c in &l.leading {
                out.push_str(c);
                out.push('\n');
            }
            out.push_str(&l.code);
            if let Some(t) = &l.trailing {
                out.push_str(&" ".repeat(column - l.code.chars().count()));
                out.push_str(t);
            }
            out.push('\n');
        }
        run_start = run_end;
    }
    if !closing.is_empty() {
        out.push('\n');
        for c in closing {
            out.push_str(&c);
            out.push('\n');
        }
    }
    out
}
