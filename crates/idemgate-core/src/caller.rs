//! Whether the thread polling an engine future may block on I/O. An event loop's thread (Node's)
//! polls a call's future once before handing it to the runtime, so that work needing no I/O
//! answers without a trip through the runtime's threads; it marks that poll with
//! [`without_blocking`], and a store that could otherwise do its I/O on the calling thread
//! (SQLite's idle writer runs a lone write inline) hands the work to its own thread instead.

use std::cell::Cell;

thread_local! {
    static NO_BLOCKING: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with this thread marked as one that must not block on I/O (see the module docs).
pub fn without_blocking<T>(f: impl FnOnce() -> T) -> T {
    /// Restores the mark as it was, also when `f` panics.
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            NO_BLOCKING.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(NO_BLOCKING.with(|c| c.replace(true)));
    f()
}

/// False inside [`without_blocking`]: a store must not do blocking I/O on this thread now.
pub fn may_block() -> bool {
    !NO_BLOCKING.with(Cell::get)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mark_holds_inside_only_and_nests() {
        assert!(may_block());
        without_blocking(|| {
            assert!(!may_block());
            without_blocking(|| assert!(!may_block()));
            assert!(!may_block(), "an inner mark leaves the outer one");
        });
        assert!(may_block());
        let _ = std::panic::catch_unwind(|| without_blocking(|| panic!("in f")));
        assert!(may_block(), "restored after a panic");
        without_blocking(|| {
            let other = std::thread::spawn(may_block).join().unwrap();
            assert!(other, "the mark is this thread's only");
        });
    }
}
