//! The progress bar of `prepare` on stderr: bytes read, MB/s and tokens written. indicatif
//! hides it when stderr is not a terminal (logs, CI, tests).

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A byte-count progress bar with a token count in its message.
pub(crate) struct Progress {
    bar: ProgressBar,
}

impl Progress {
    /// A bar over `total_bytes` of input, labelled `label` ("scanning", "tokenizing");
    /// hidden if `show` is false or stderr is not a terminal.
    pub fn new(total_bytes: u64, label: &'static str, show: bool) -> Progress {
        let target = if show { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() };
        let bar = ProgressBar::with_draw_target(Some(total_bytes), target);
        let style = ProgressStyle::with_template(
            "{prefix:>10} [{elapsed_precise}] {wide_bar} {decimal_bytes}/{decimal_total_bytes} {decimal_bytes_per_sec} {msg}",
        )
        .expect("the template is valid");
        bar.set_style(style);
        bar.set_prefix(label);
        Progress { bar }
    }

    /// Moves the bar to `bytes` read and shows `tokens` written.
    pub fn update(&self, bytes: u64, tokens: u64) {
        self.bar.set_position(bytes);
        if tokens > 0 {
            self.bar.set_message(format!("{tokens} tokens"));
        }
    }

    /// Removes the bar.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
