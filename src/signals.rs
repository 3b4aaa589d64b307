//! SIGINT and SIGTERM, one way for every command that runs until stopped or for long
//! (capture, sim, replay, its sweeps and the demo): the first signal asks for a graceful stop (what that is, is the
//! command's), a command may give the next ones a step of their own (replay: cancel the
//! requests in flight), and the one after the last step ends the process at once with the
//! first signal's status (130 for SIGINT, 143 for SIGTERM; what was not finished is in the
//! command's journal, for the next start or `merge` to recover).

use anyhow::{Context, Result};
use tokio::sync::watch;

use crate::exit::ExitStatus;

/// A signal that stops a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Signal {
    Int,
    Term,
}

impl Signal {
    /// Its name, as results record it (`llmreplay.interrupted.reason`).
    pub(crate) fn name(self) -> &'static str {
        match self {
            Signal::Int => "SIGINT",
            Signal::Term => "SIGTERM",
        }
    }

    /// The signal of a name [`Signal::name`] gave.
    pub(crate) fn named(name: &str) -> Option<Signal> {
        [Signal::Int, Signal::Term]
            .into_iter()
            .find(|s| s.name() == name)
    }

    /// The exit status of a command this signal stopped.
    pub(crate) fn status(self) -> ExitStatus {
        match self {
            Signal::Int => ExitStatus::Interrupted,
            Signal::Term => ExitStatus::Terminated,
        }
    }
}

/// What the n-th signal does (given that signal), for n = 1..=steps.
pub(crate) type Step = Box<dyn FnMut(Signal) + Send>;

/// A step that does nothing but let [`FirstSignal::wait`] return.
pub(crate) fn graceful() -> Step {
    Box::new(|_| {})
}

/// What the n-th signal of the process does, with `steps` steps.
#[derive(Debug, PartialEq, Eq)]
enum Action {
    Step(usize),
    ExitNow,
}

fn action(n: usize, steps: usize) -> Action {
    if n <= steps {
        Action::Step(n - 1)
    } else {
        Action::ExitNow
    }
}

/// The first signal, once it has come.
pub(crate) struct FirstSignal(watch::Receiver<Option<Signal>>);

impl FirstSignal {
    /// Waits for the first signal (returns at once if it came already).
    pub(crate) async fn wait(&mut self) -> Signal {
        match self.0.wait_for(Option::is_some).await {
            Ok(s) => s.unwrap_or(Signal::Int),
            // The watching thread is gone (it never returns): wait for ever, as without it.
            Err(_) => std::future::pending().await,
        }
    }
}

/// From now on, for the rest of the process, SIGINT and SIGTERM are taken on a thread of
/// their own: the n-th runs `steps[n - 1]` (after [`FirstSignal`] learns of the first), and
/// the one after the last step prints `llmreplay COMMAND: SIG…: exiting at once` and ends
/// the process with the first signal's status. With no steps, the first signal exits at once.
pub(crate) fn watch(command: &'static str, steps: Vec<Step>) -> Result<FirstSignal> {
    watch_noting(command, steps, String::new())
}

/// [`watch`], with `at_exit` said after `exiting at once` (what the exit loses and keeps).
pub(crate) fn watch_noting(
    command: &'static str,
    mut steps: Vec<Step>,
    at_exit: String,
) -> Result<FirstSignal> {
    use tokio::signal::unix::{signal, SignalKind};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("signal runtime")?;
    let (mut int, mut term) = {
        let _in_rt = rt.enter();
        (
            signal(SignalKind::interrupt()).context("SIGINT handler")?,
            signal(SignalKind::terminate()).context("SIGTERM handler")?,
        )
    };
    let (first_tx, first_rx) = watch::channel(None);
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            rt.block_on(async move {
                let mut first = None;
                for n in 1.. {
                    let sig = tokio::select! {
                        _ = int.recv() => Signal::Int,
                        _ = term.recv() => Signal::Term,
                    };
                    let first = *first.get_or_insert(sig);
                    match action(n, steps.len()) {
                        Action::Step(i) => {
                            first_tx.send_replace(Some(first));
                            steps[i](sig);
                        }
                        Action::ExitNow => {
                            eprintln!(
                                "llmreplay {command}: {}: exiting at once{at_exit}",
                                sig.name()
                            );
                            first.status().exit_now();
                        }
                    }
                }
            })
        })
        .context("signal thread")?;
    Ok(FirstSignal(first_rx))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signal_after_the_last_step_exits() {
        assert_eq!(action(1, 0), Action::ExitNow);
        assert_eq!(action(1, 1), Action::Step(0));
        assert_eq!(action(2, 1), Action::ExitNow);
        assert_eq!(action(2, 2), Action::Step(1));
        assert_eq!(action(3, 2), Action::ExitNow);
    }

    #[test]
    fn names_and_statuses() {
        for s in [Signal::Int, Signal::Term] {
            assert_eq!(Signal::named(s.name()), Some(s));
        }
        assert_eq!(Signal::named("deadline"), None);
        assert_eq!(Signal::Int.status().code(), 130);
        assert_eq!(Signal::Term.status().code(), 143);
    }
}
