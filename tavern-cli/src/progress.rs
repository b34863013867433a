//! Progress bars on stderr for work that can take more than a second (import, export, check,
//! compact); hidden when stderr is not a terminal. Part of the output layer.

use std::borrow::Cow;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::Context;

/// A progress bar, or nothing when progress is hidden.
#[derive(Debug)]
pub struct Progress(ProgressBar);

impl Progress {
    /// A bar over `len` steps.
    pub fn bar(ctx: &Context, len: u64, message: impl Into<Cow<'static, str>>) -> Self {
        let bar = ProgressBar::with_draw_target(Some(len), target(ctx));
        if let Ok(style) = ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len}") {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_message(message);
        Self(bar)
    }

    /// A spinner for work of unknown length.
    pub fn spinner(ctx: &Context, message: impl Into<Cow<'static, str>>) -> Self {
        let bar = ProgressBar::with_draw_target(None, target(ctx));
        bar.set_message(message);
        if ctx.progress {
            bar.enable_steady_tick(std::time::Duration::from_millis(120));
        }
        Self(bar)
    }

    /// One step done.
    pub fn inc(&self) {
        self.0.inc(1);
    }

    /// `done` of `of` steps done (work whose length is known only once it starts).
    pub fn set(&self, done: u64, of: u64) {
        self.0.set_length(of);
        self.0.set_position(done);
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.0.finish_and_clear();
    }
}

fn target(ctx: &Context) -> ProgressDrawTarget {
    if ctx.progress {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    }
}
