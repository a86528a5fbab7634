//! A tiny `log` backend that captures warnings from libraries (glommio reports a failed
//! fixed-buffer registration only through `log::warn!`), so the probe can report them
//! in its output instead of losing them or interleaving them with the table.

use std::sync::{Mutex, OnceLock};

struct Capture {
    lines: Mutex<Vec<String>>,
}

impl log::Log for Capture {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::Level::Warn
    }

    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            let line = format!("{} [{}]: {}", record.level(), record.target(), record.args());
            if let Ok(mut v) = self.lines.lock() {
                v.push(line);
            }
        }
    }

    fn flush(&self) {}
}

static CAPTURE: OnceLock<&'static Capture> = OnceLock::new();

/// Installs the capturing logger (warnings and errors only). Idempotent; if another
/// logger is already installed, nothing is captured.
pub fn install() {
    CAPTURE.get_or_init(|| {
        let c: &'static Capture = Box::leak(Box::new(Capture { lines: Mutex::new(Vec::new()) }));
        if log::set_logger(c).is_ok() {
            log::set_max_level(log::LevelFilter::Warn);
        }
        c
    });
}

/// Takes (and clears) the captured log lines.
pub fn take() -> Vec<String> {
    CAPTURE.get().and_then(|c| c.lines.lock().ok().map(|mut v| std::mem::take(&mut *v))).unwrap_or_default()
}
