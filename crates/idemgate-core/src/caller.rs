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
//!
//! And a call that is the only one in flight in a process whose every task runs on one thread
//! (the MCP proxy's single-threaded runtime) is polled under [`alone`]: nothing else is waiting
//! for that thread, so a store may do the call's write on it (SQLite commits inline) instead of
//! handing it to its own thread and waiting to be woken. On a busy machine each such hand-off
//! waits for a core; with other calls in flight the hand-off stays, so that their writes share a
//! commit.
//!
//! Last, an event loop that carries a store's bytes itself (Node's, over a socket of its own) polls
//! a call's future under [`on_loop`]: a store with such a connection (Redis's carried link) then
//! queues the call's commands there, for the loop to write, and the loop hands the replies back
//! and polls the future again on its own thread. A round trip then costs the loop's own write
//! and read, as a native client's, instead of two hand-offs to a runtime thread and back, each
//! of which waits for a core on a busy machine. `on_loop` also says whether the future waits for
//! such a reply now ([`awaits_loop`]): if not, it waits for something else and goes on on the
//! runtime.

use std::cell::Cell;

thread_local! {
    static NO_BLOCKING: Cell<bool> = const { Cell::new(false) };
    static WAITING: Cell<bool> = const { Cell::new(false) };
    static ALONE: Cell<bool> = const { Cell::new(false) };
    static ON_LOOP: Cell<bool> = const { Cell::new(false) };
    static AWAITS_LOOP: Cell<bool> = const { Cell::new(false) };
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

/// Polls `future` marked as [`alone`] whenever `lone()` says, at that poll, that it is the only
/// call in flight (see the module docs).
pub async fn alone<F: std::future::Future>(lone: impl Fn() -> bool, future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    std::future::poll_fn(|cx| {
        if lone() {
            marked(&ALONE, || future.as_mut().poll(cx))
        } else {
            future.as_mut().poll(cx)
        }
    })
    .await
}

/// True while a lone call is polled under [`alone`] (and not inside [`without_blocking`]): a
/// store may do this call's write on this thread, blocking it, even on a single-threaded runtime.
pub fn is_alone() -> bool {
    ALONE.with(Cell::get) && may_block()
}

/// Runs `f` (one poll of a call's future, on the thread of an event loop that carries a store's
/// bytes) marked so, and says whether the future now waits for a reply the loop is to carry
/// (a store called [`awaits_loop`] during the poll).
pub fn on_loop<T>(f: impl FnOnce() -> T) -> (T, bool) {
    let before = AWAITS_LOOP.with(|c| c.replace(false));
    let out = marked(&ON_LOOP, f);
    let awaits = AWAITS_LOOP.with(|c| c.replace(before));
    (out, awaits)
}

/// True inside [`on_loop`]: a store may queue this call's commands on the loop's connection.
pub fn is_on_loop() -> bool {
    ON_LOOP.with(Cell::get)
}

/// Called by a store's future that waits for a reply on the loop's connection (see [`on_loop`]).
pub fn awaits_loop() {
    if is_on_loop() {
        AWAITS_LOOP.with(|c| c.set(true));
    }
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
    fn on_loop_says_whether_the_poll_left_the_future_waiting_for_the_loop() {
        assert!(!is_on_loop());
        awaits_loop(); // off the loop: not noted
        let ((), awaits) = on_loop(|| assert!(is_on_loop()));
        assert!(!awaits, "nothing waited for the loop");
        let ((), awaits) = on_loop(awaits_loop);
        assert!(awaits);
        let ((), outer) = on_loop(|| {
            awaits_loop();
            let ((), inner) = on_loop(|| {});
            assert!(!inner, "an inner poll reports its own waiting only");
        });
        assert!(outer, "and leaves the outer poll's as it was");
        assert!(!is_on_loop());
    }

    #[test]
    fn a_lone_call_is_marked_only_while_it_is_alone_and_only_during_its_polls() {
        use std::future::Future as _;
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::task::{Context, Poll, Waker};
        let lone = AtomicBool::new(true);
        let seen = std::cell::RefCell::new(Vec::new());
        let mut polls = 0;
        let probe = std::future::poll_fn(|cx| {
            seen.borrow_mut().push(is_alone());
            polls += 1;
            if polls == 3 {
                return Poll::Ready(());
            }
            cx.waker().wake_by_ref();
            Poll::Pending
        });
        let mut future = std::pin::pin!(alone(|| lone.load(Ordering::SeqCst), probe));
        let mut cx = Context::from_waker(Waker::noop());
        assert!(future.as_mut().poll(&mut cx).is_pending());
        assert!(!is_alone(), "only during the poll");
        lone.store(false, Ordering::SeqCst);
        assert!(future.as_mut().poll(&mut cx).is_pending());
        lone.store(true, Ordering::SeqCst);
        without_blocking(|| assert!(future.as_mut().poll(&mut cx).is_ready()));
        assert_eq!(
            *seen.borrow(),
            [true, false, false],
            "never while it must not block"
        );
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
