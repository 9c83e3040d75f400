//! A progress bar on stderr for runs longer than a second, and nothing at
//! all when stderr is not a terminal (scripts, CI, pipes).
//!
//! Clients count their operations into a shared counter
//! ([`Progress::counter`]); a ticker thread draws the bar from it, so the
//! clients never touch the terminal.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How long a run goes before its bar appears.
const DELAY: Duration = Duration::from_secs(1);
/// How often the bar is redrawn.
const TICK: Duration = Duration::from_millis(100);

/// The bar of one benchmark (every system of it).
pub struct Progress {
    counter: Arc<AtomicU64>,
    label: Arc<Mutex<String>>,
    stop: Arc<AtomicBool>,
    ticker: Option<JoinHandle<()>>,
}

impl Progress {
    /// A bar for `total` operations, shown after a second if stderr is a
    /// terminal (and `enabled`).
    pub fn start(total: u64, enabled: bool) -> Progress {
        let counter = Arc::new(AtomicU64::new(0));
        let label = Arc::new(Mutex::new(String::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let ticker = (enabled && std::io::stderr().is_terminal()).then(|| {
            let (counter, label, stop) = (counter.clone(), label.clone(), stop.clone());
            thread::spawn(move || tick(total, &counter, &label, &stop))
        });
        Progress { counter, label, stop, ticker }
    }

    /// The counter clients add their operations to.
    pub fn counter(&self) -> Arc<AtomicU64> {
        self.counter.clone()
    }

    /// What is running now (shown beside the bar).
    pub fn set_label(&self, s: impl Into<String>) {
        if let Ok(mut l) = self.label.lock() {
            *l = s.into();
        }
    }

    /// Removes the bar.
    pub fn finish(mut self) {
        self.stop_ticker();
    }

    fn stop_ticker(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.ticker.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.stop_ticker();
    }
}

fn tick(total: u64, counter: &AtomicU64, label: &Mutex<String>, stop: &AtomicBool) {
    let started = Instant::now();
    let mut bar: Option<ProgressBar> = None;
    while !stop.load(Ordering::Relaxed) {
        thread::sleep(TICK);
        if bar.is_none() && started.elapsed() >= DELAY {
            let b = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:40} {percent:>3}% {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar());
            b.set_style(style);
            bar = Some(b);
        }
        if let Some(b) = &bar {
            b.set_position(counter.load(Ordering::Relaxed).min(total));
            if let Ok(l) = label.lock() {
                b.set_message(l.clone());
            }
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
}
