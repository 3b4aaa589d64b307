//! The panic guard of [`read_parquet`](super::read_parquet): a process-wide panic hook, installed once, that keeps
//! panics raised inside [`quietly`] on this thread off stderr and keeps their message for the
//! error; every other panic goes to the hook that was installed before.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::sync::Once;

thread_local! {
    static QUIET: Cell<bool> = const { Cell::new(false) };
    static MESSAGE: RefCell<Option<String>> = const { RefCell::new(None) };
}

pub(super) fn install_quiet_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if QUIET.with(Cell::get) {
                let at = info
                    .location()
                    .map(|l| format!(" at {}:{}", l.file(), l.line()))
                    .unwrap_or_default();
                let msg = format!("{}{at}", payload_message(info.payload()));
                MESSAGE.with(|m| *m.borrow_mut() = Some(msg));
            } else {
                previous(info);
            }
        }));
    });
}

/// Runs `f` with this thread's panics kept quiet (restored on return and on unwind).
pub(super) fn quietly<T>(f: impl FnOnce() -> T) -> T {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            QUIET.with(|q| q.set(self.0));
        }
    }
    let _reset = Reset(QUIET.with(|q| q.replace(true)));
    MESSAGE.with(|m| m.borrow_mut().take());
    f()
}

/// The message of the last quiet panic on this thread.
pub(super) fn take_message() -> Option<String> {
    MESSAGE.with(|m| m.borrow_mut().take())
}

pub(super) fn payload_message(p: &(dyn Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}
