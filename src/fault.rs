//! Named crash points and I/O faults for the crash-consistency harness.
//!
//! Armed by `TEPHRA_CRASH_POINT=<site>:<action>[:<skip>[:<count>]]` in a build with the
//! `crash-points` feature; `action` is `abort`, `eio`, `enospc`, `eopnotsupp`, `shortwrite` or `pause` (see
//! [`pause_point`]), `skip` lets that many hits pass first, and `count` (default: no limit) is
//! how many hits of an I/O fault fail before the site works again. Without the feature both functions are empty and inline away.

/// Aborts the process at `site` when armed with `abort`.
#[inline(always)]
pub fn crash_point(site: &str) {
    #[cfg(feature = "crash-points")]
    armed::hit(site, true).ok();
    #[cfg(not(feature = "crash-points"))]
    let _ = site;
}

/// True when `site` is armed (any action) and its skip count has passed: for sites that need
/// their own fault, like `torn_marker` (write part of the commit marker, then abort).
#[inline(always)]
pub fn fires(site: &str) -> bool {
    #[cfg(feature = "crash-points")]
    return armed::fires(site);
    #[cfg(not(feature = "crash-points"))]
    {
        let _ = site;
        false
    }
}

/// Aborts the process at once, naming `site` on stderr (what an armed `abort` does).
pub fn abort_at(site: &str) -> ! {
    eprintln!("crash point {site}: abort");
    std::process::abort()
}

/// Holds the calling thread at `site` when armed with `pause` (the site may name several,
/// joined by `+`: `before_bind+before_check:pause`), so a test can act inside a race window:
/// says `pause point <site>` on stderr, then waits until the file `<TEPHRA_CRASH_RELEASE>-<site>`
/// exists (at most 60 s), or one second when that variable is unset.
#[inline(always)]
pub fn pause_point(site: &str) {
    #[cfg(feature = "crash-points")]
    if armed::pauses(site) {
        eprintln!("pause point {site}");
        match std::env::var_os("TEPHRA_CRASH_RELEASE") {
            Some(f) => {
                let mut f = f;
                f.push(format!("-{site}"));
                let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
                while !std::path::Path::new(&f).exists() && std::time::Instant::now() < until {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            }
            None => std::thread::sleep(std::time::Duration::from_secs(1)),
        }
    }
    #[cfg(not(feature = "crash-points"))]
    let _ = site;
}

/// Returns an injected I/O error at `site` when armed with `eio`, `enospc`, `eopnotsupp` or `shortwrite`
/// (aborts when armed with `abort`).
///
/// # Errors
/// The injected error: `EIO` (5), `ENOSPC` (28) or `WriteZero`.
#[inline(always)]
pub fn io_point(site: &str) -> std::io::Result<()> {
    #[cfg(feature = "crash-points")]
    return armed::hit(site, false);
    #[cfg(not(feature = "crash-points"))]
    {
        let _ = site;
        Ok(())
    }
}

#[cfg(feature = "crash-points")]
mod armed {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;

    struct Arm {
        site: String,
        action: String,
        skip: u64,
        count: u64,
    }

    fn arm() -> &'static Option<Arm> {
        static A: OnceLock<Option<Arm>> = OnceLock::new();
        A.get_or_init(|| {
            let v = std::env::var("TEPHRA_CRASH_POINT").ok()?;
            let mut it = v.split(':');
            let site = it.next()?.to_owned();
            let action = it.next().unwrap_or("abort").to_owned();
            let skip = it.next().and_then(|s| s.parse().ok()).unwrap_or(0);
            let count = it.next().and_then(|s| s.parse().ok()).unwrap_or(u64::MAX);
            Some(Arm { site, action, skip, count })
        })
    }

    static HITS: AtomicU64 = AtomicU64::new(0);

    pub fn fires(site: &str) -> bool {
        let Some(a) = arm() else { return false };
        a.site == site && HITS.fetch_add(1, Ordering::SeqCst) >= a.skip
    }

    pub fn pauses(site: &str) -> bool {
        matches!(arm(), Some(a) if a.action == "pause" && a.site.split('+').any(|s| s == site))
    }

    pub fn hit(site: &str, abort_only: bool) -> std::io::Result<()> {
        let Some(a) = arm() else { return Ok(()) };
        if a.site != site {
            return Ok(());
        }
        let n = HITS.fetch_add(1, Ordering::SeqCst);
        if n < a.skip || n - a.skip >= a.count {
            return Ok(());
        }
        match a.action.as_str() {
            "abort" => super::abort_at(site),
            _ if abort_only => Ok(()),
            "eio" => Err(std::io::Error::from_raw_os_error(libc::EIO)),
            "enospc" => Err(std::io::Error::from_raw_os_error(libc::ENOSPC)),
            "eopnotsupp" => Err(std::io::Error::from_raw_os_error(libc::EOPNOTSUPP)),
            "shortwrite" => Err(std::io::Error::new(std::io::ErrorKind::WriteZero, "injected short write")),
            _ => Ok(()),
        }
    }
}
