//! The one lock helper of the workspace: every crate above this one locks through it.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, taking the data even if another thread panicked while holding it. The
/// critical sections it guards are single assignments, clones and map updates, so a
/// panic elsewhere in the holding thread leaves no half-done update behind.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_still_yields_its_data() {
        let m = std::sync::Arc::new(Mutex::new(7));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let _g = lock(&m2);
            panic!("poison it");
        })
        .join();
        assert!(m.is_poisoned());
        assert_eq!(*lock(&m), 7);
    }
}
