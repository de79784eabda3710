//! Progress on stderr for work that takes a while: a spinner per step and a
//! bar over a list (files, a sweep's values). Drawn only on a terminal, and
//! only once the work has lasted [`DELAY`]; `--quiet` draws nothing. Output
//! that is a result (tables, "wrote …") never goes through here.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::borrow::Cow;
use std::time::Duration;

/// How long a step runs before its spinner appears.
pub const DELAY: Duration = Duration::from_secs(2);

/// What the command may draw.
#[derive(Clone)]
pub struct Ui {
    quiet: bool,
    /// Where steps draw once shown (stderr, or a test's recorder).
    target: fn() -> ProgressDrawTarget,
    delay: Duration,
}

impl Ui {
    pub fn new(quiet: bool) -> Ui {
        Ui { quiet, target: ProgressDrawTarget::stderr, delay: DELAY }
    }

    /// The steps of work under a bar: they draw nothing, so that the bar
    /// alone does.
    pub fn under_bar(&self) -> Ui {
        Ui { quiet: true, ..self.clone() }
    }

    /// A spinner with `message` while the returned step lives.
    pub fn step(&self, message: impl Into<Cow<'static, str>>) -> Step {
        let style = ProgressStyle::with_template("{spinner} {msg} ({elapsed})").expect("a valid template");
        self.start(ProgressBar::hidden().with_style(style).with_message(message))
    }

    /// A bar over `len` items (`inc` after each) while the returned step lives.
    pub fn bar(&self, len: u64, message: impl Into<Cow<'static, str>>) -> Step {
        let style = ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} ({elapsed})").expect("a valid template");
        let bar = ProgressBar::hidden().with_style(style).with_message(message);
        bar.set_length(len);
        self.start(bar)
    }

    /// A line of progress (a sweep's step), unless quiet; drawn around any bar.
    pub fn note(&self, step: &Step, line: &str) {
        if !self.quiet {
            step.0.suspend(|| eprintln!("{line}"));
        }
    }

    fn start(&self, bar: ProgressBar) -> Step {
        if self.quiet {
            return Step(bar);
        }
        bar.enable_steady_tick(Duration::from_millis(120));
        let (shown, target, delay) = (bar.clone(), self.target, self.delay);
        if delay.is_zero() {
            shown.set_draw_target(target());
        } else {
            // The process may end first: the thread only ever draws a live step.
            std::thread::spawn(move || {
                std::thread::sleep(delay);
                if !shown.is_finished() {
                    shown.set_draw_target(target());
                }
            });
        }
        Step(bar)
    }
}

/// A step in progress: cleared from the terminal when dropped.
pub struct Step(ProgressBar);

impl Step {
    pub fn set_message(&self, message: impl Into<Cow<'static, str>>) {
        self.0.set_message(message);
    }

    pub fn inc(&self) {
        self.0.inc(1);
    }
}

impl Drop for Step {
    fn drop(&mut self) {
        self.0.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use indicatif::TermLike;
    use std::sync::{Arc, Mutex};

    /// A terminal that keeps what was written to it.
    #[derive(Debug, Default)]
    struct Recorder(Arc<Mutex<String>>);

    static SEEN: Mutex<Option<Arc<Mutex<String>>>> = Mutex::new(None);

    impl TermLike for Recorder {
        fn width(&self) -> u16 {
            80
        }
        fn move_cursor_up(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_down(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_right(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_left(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn write_line(&self, s: &str) -> std::io::Result<()> {
            self.write_str(s)
        }
        fn write_str(&self, s: &str) -> std::io::Result<()> {
            self.0.lock().unwrap().push_str(s);
            Ok(())
        }
        fn clear_line(&self) -> std::io::Result<()> {
            Ok(())
        }
        fn flush(&self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn recorder() -> ProgressDrawTarget {
        let seen = SEEN.lock().unwrap().clone().expect("a recording");
        ProgressDrawTarget::term_like(Box::new(Recorder(seen)))
    }

    /// What `work` draws through a `Ui` with no delay.
    fn drawn(quiet: bool, work: impl FnOnce(&Ui)) -> String {
        let seen = Arc::new(Mutex::new(String::new()));
        *SEEN.lock().unwrap() = Some(seen.clone());
        work(&Ui { quiet, target: recorder, delay: Duration::ZERO });
        let text = seen.lock().unwrap().clone();
        text
    }

    #[test]
    fn steps_draw_their_message_and_quiet_draws_nothing() {
        let work = |ui: &Ui| {
            let step = ui.bar(3, "checking");
            step.inc();
            step.set_message("checking b.attn");
            std::thread::sleep(Duration::from_millis(300));
        };
        let text = drawn(false, work);
        assert!(text.contains("1/3 checking b.attn"), "{text:?}");
        assert_eq!(drawn(true, work), "");
    }
}
