//! Synchronisation between the tasks of one executor.

use std::rc::Rc;

/// A counting semaphore for the tasks of one executor (glommio's: a waiter asking for fewer
/// units may be served before a larger one that waits). Clones share the units.
#[derive(Clone)]
pub struct Semaphore(Rc<glommio::sync::Semaphore>);

/// Units taken from a [`Semaphore`], given back when dropped.
pub struct Permit(#[allow(dead_code)] glommio::sync::StaticPermit);

impl Semaphore {
    /// A semaphore holding `units`.
    pub fn new(units: u64) -> Semaphore {
        Semaphore(Rc::new(glommio::sync::Semaphore::new(units)))
    }

    /// Waits for `units`; `None` once the semaphore is closed.
    pub async fn acquire(&self, units: u64) -> Option<Permit> {
        self.0.acquire_static_permit(units).await.ok().map(Permit)
    }

    /// Takes `units` if they are free now.
    pub fn try_acquire(&self, units: u64) -> Option<Permit> {
        self.0.try_acquire_static_permit(units).ok().map(Permit)
    }
}
