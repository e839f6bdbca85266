//! Whether the thread polling an engine future may block on I/O. An event loop's thread (Node's)
//! polls a call's future once before handing it to the runtime, so that work needing no I/O
//! answers without a trip through the runtime's threads; it marks that poll with
//! [`without_blocking`], and a store that could otherwise do its I/O on the calling thread
//! (SQLite's idle writer runs a lone write inline) hands the work to its own thread instead.
//!
//! The other way round, a caller that does nothing but wait for the answer (a Python thread in
//! a call, the GIL released) marks its wait with [`waiting`]: a store with a connection per such
//! thread (Redis) then does its round trips right on it, blocking, instead of handing each one
//! to a runtime thread and back.

use std::cell::Cell;

thread_local! {
    static NO_BLOCKING: Cell<bool> = const { Cell::new(false) };
    static WAITING: Cell<bool> = const { Cell::new(false) };
}

/// Sets `mark` for the length of `f`, restored as it was afterwards, also when `f` panics.
fn marked<T>(mark: &'static std::thread::LocalKey<Cell<bool>>, f: impl FnOnce() -> T) -> T {
    struct Restore(&'static std::thread::LocalKey<Cell<bool>>, bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            self.0.with(|c| c.set(self.1));
        }
    }
    let _restore = Restore(mark, mark.with(|c| c.replace(true)));
    f()
}

/// Runs `f` with this thread marked as one that must not block on I/O (see the module docs).
pub fn without_blocking<T>(f: impl FnOnce() -> T) -> T {
    marked(&NO_BLOCKING, f)
}

/// Runs `f` (a `block_on` of one call's future) with this thread marked as a caller that only
/// waits for the answer, so that a store may do the call's I/O on it (see the module docs).
/// Only futures polled by this very thread see the mark: tasks they spawn run elsewhere.
pub fn waiting<T>(f: impl FnOnce() -> T) -> T {
    marked(&WAITING, f)
}

/// True inside [`waiting`] (and not inside [`without_blocking`]): a store may block this thread
/// on its own I/O now.
pub fn waits() -> bool {
    WAITING.with(Cell::get) && may_block()
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

    #[test]
    fn a_waiting_caller_is_marked_inside_only_and_never_while_it_must_not_block() {
        assert!(!waits());
        waiting(|| {
            assert!(waits());
            without_blocking(|| assert!(!waits(), "an event loop's poll never blocks"));
            assert!(waits());
            let other = std::thread::spawn(waits).join().unwrap();
            assert!(!other, "the mark is this thread's only");
        });
        assert!(!waits());
        let _ = std::panic::catch_unwind(|| waiting(|| panic!("in f")));
        assert!(!waits(), "restored after a panic");
    }
}
