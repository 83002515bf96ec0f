//! Waiting for results and watching queues: polling, cut short by LISTEN.
//!
//! Every wait registers for the task's done signal *before* it reads the
//! row, re-reads on each signal, and re-reads on a backstop timer (100 ms
//! growing 1.5x to 500 ms, as protocol v1 says) whether or not a signal
//! came. So a notification lost on the way, or sent between the read and
//! the wait, costs at most one backstop interval; without any listener the
//! wait still finishes, by polling.

use std::time::{Duration, Instant};

use tokio::sync::broadcast;

use crate::error::{Error, Result};
use crate::executor::PgExecutor;
use crate::options::NewTask;
use crate::signals::{Channel, Signal};
use crate::store::Store;
use crate::task::{Task, TaskStatus};

const FIRST_BACKSTOP: Duration = Duration::from_millis(100);
const MAX_BACKSTOP: Duration = Duration::from_millis(500);

/// The backstop after `current`: x1.5, at most [`MAX_BACKSTOP`].
fn grow(current: Duration) -> Duration {
    (current * 3 / 2).min(MAX_BACKSTOP)
}

/// A probe that failed for a passing reason (the pool saturated, its
/// breaker open, a lost connection, a timeout) is retried on the next
/// backstop rather than failing the wait: `Ok(None)`. Anything else fails it.
fn transient<T>(probe: Result<T>) -> Result<Option<T>> {
    use crate::executor::ExecErrorKind::*;
    match probe {
        Ok(v) => Ok(Some(v)),
        Err(e)
            if matches!(e.exec_kind(), Some(Saturated | CircuitOpen | Connection | Timeout | Capacity)) =>
        {
            tracing::debug!(error = %e, "wait probe failed; trying again on the backstop");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

impl<E: PgExecutor> Store<E> {
    /// Waits until task `id` is terminal and returns it, whatever its end
    /// (succeeded, failed or canceled). Past `timeout` it fails with
    /// [`Error::TaskTimeout`]; the task is not stopped. An unknown id is
    /// [`Error::NotFound`].
    pub async fn wait(&self, id: &str, timeout: Duration) -> Result<Task> {
        let started = Instant::now();
        let mut subscription = self.signals.subscribe_done(id);
        self.signals.ensure_listening(self.executor(), Channel::Done).await;
        let mut backstop = FIRST_BACKSTOP;
        loop {
            let probe = {
                let _turn = self.signals.probes.acquire().await.expect("the probe semaphore is never closed");
                self.get_status(id).await
            };
            match transient(probe)? {
                Some(None) => return Err(Error::NotFound { what: format!("task {id}") }),
                Some(Some(state)) if state.status.is_terminal() => return self.fetch(id).await,
                _ => {}
            }
            let left = timeout.saturating_sub(started.elapsed());
            if left.is_zero() {
                return Err(Error::TaskTimeout { task_id: id.to_owned(), waited: started.elapsed() });
            }
            subscription.wait(backstop.min(left)).await;
            backstop = grow(backstop);
            self.signals.ensure_listening(self.executor(), Channel::Done).await;
        }
    }

    /// Waits for the task the key names, re-resolving the key at each probe
    /// (a `replace` may point it at a new task meanwhile). An unknown key is
    /// [`Error::NotFound`].
    pub async fn wait_by_key(&self, key: &str, timeout: Duration) -> Result<Task> {
        let started = Instant::now();
        let mut subscription = None;
        let mut backstop = FIRST_BACKSTOP;
        loop {
            let probe = {
                let _turn = self.signals.probes.acquire().await.expect("the probe semaphore is never closed");
                transient(self.get_status_by_key(key).await)?
            };
            let state = match probe {
                Some(Some(state)) => state,
                Some(None) => return Err(Error::NotFound { what: format!("key {key:?}") }),
                None => {
                    // The probe could not run now: try again on the backstop.
                    let left = timeout.saturating_sub(started.elapsed());
                    if left.is_zero() {
                        return Err(Error::TaskTimeout {
                            task_id: format!("key {key:?}"),
                            waited: started.elapsed(),
                        });
                    }
                    tokio::time::sleep(backstop.min(left)).await;
                    backstop = grow(backstop);
                    continue;
                }
            };
            // Register for the task the key names now; if that changed, the
            // read below is the re-read that a registration must precede.
            if subscription.as_ref().is_none_or(|(id, _)| *id != state.id) {
                subscription = Some((state.id.clone(), self.signals.subscribe_done(&state.id)));
                self.signals.ensure_listening(self.executor(), Channel::Done).await;
                continue;
            }
            if state.status.is_terminal() {
                return self.fetch(&state.id).await;
            }
            let left = timeout.saturating_sub(started.elapsed());
            if left.is_zero() {
                return Err(Error::TaskTimeout { task_id: state.id, waited: started.elapsed() });
            }
            if let Some((_, s)) = subscription.as_mut() {
                s.wait(backstop.min(left)).await;
            }
            backstop = grow(backstop);
            self.signals.ensure_listening(self.executor(), Channel::Done).await;
        }
    }

    /// Submits `task` and waits for its end: `Ok` with the succeeded task,
    /// [`Error::TaskFailed`] with its envelope, [`Error::TaskCanceled`], or
    /// [`Error::TaskTimeout`] (the task keeps running).
    pub async fn call(&self, task: NewTask, timeout: Duration) -> Result<Task> {
        let submitted = self.submit(task).await?;
        let done = self.wait(&submitted.id, timeout).await?;
        match done.status {
            TaskStatus::Succeeded => Ok(done),
            TaskStatus::Failed => {
                Err(Error::TaskFailed { error: done.error_envelope().map(Box::new), task_id: done.id })
            }
            _ => Err(Error::TaskCanceled { task_id: done.id }),
        }
    }

    /// Watches `queues`: signals when a task becomes queued in one of them,
    /// when any task finishes, and [`Signal::Poll`] every `poll_interval`
    /// (and whenever notifications may have been missed). A signal means
    /// "re-read now"; the tables hold the truth. Idle, a watch costs no
    /// queries beyond its timer, and it brings a lost listener back from it.
    pub fn watch<I, S>(&self, queues: I, poll_interval: Duration) -> Watch<'_, E>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.watch_with(queues, poll_interval, true)
    }

    /// [`Store::watch`] without the done signals: only queued and poll. It
    /// listens to `cairnq_queued` alone, so a process that only claims (a
    /// worker) never hears the done notification of every task the fleet
    /// settles.
    pub fn watch_queues<I, S>(&self, queues: I, poll_interval: Duration) -> Watch<'_, E>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.watch_with(queues, poll_interval, false)
    }

    fn watch_with<I, S>(&self, queues: I, poll_interval: Duration, done: bool) -> Watch<'_, E>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Watch {
            store: self,
            queues: queues.into_iter().map(Into::into).collect(),
            done,
            events: self.signals.events(),
            poll_interval: poll_interval.max(Duration::from_millis(1)),
            next_poll: Instant::now() + poll_interval,
            started: false,
        }
    }

    /// Whether waits are pushed now: the store consumes a `cairnq_done`
    /// LISTEN stream (the first wait starts it). False means waits poll.
    pub fn is_listening(&self) -> bool {
        self.signals.is_listening(Channel::Done)
    }
}

/// A watch over some queues; see [`Store::watch`].
#[derive(Debug)]
pub struct Watch<'a, E> {
    store: &'a Store<E>,
    queues: Vec<String>,
    /// Whether done signals are wanted (and `cairnq_done` listened to).
    done: bool,
    events: broadcast::Receiver<Signal>,
    poll_interval: Duration,
    next_poll: Instant,
    started: bool,
}

impl<E: PgExecutor> Watch<'_, E> {
    async fn listen(&self) {
        let (signals, exec) = (&self.store.signals, self.store.executor());
        signals.ensure_listening(exec, Channel::Queued).await;
        if self.done {
            signals.ensure_listening(exec, Channel::Done).await;
        }
    }

    /// The next signal. The first call answers [`Signal::Poll`] at once, so
    /// the caller reads before it waits.
    pub async fn next(&mut self) -> Signal {
        if !self.started {
            self.started = true;
            self.listen().await;
            return Signal::Poll;
        }
        loop {
            let now = Instant::now();
            if now >= self.next_poll {
                self.next_poll = now + self.poll_interval;
                self.listen().await;
                return Signal::Poll;
            }
            let signal = tokio::time::timeout(self.next_poll - now, self.events.recv()).await;
            match signal {
                Err(_) => continue, // the poll timer; answered above
                Ok(Ok(Signal::Queued(q))) => {
                    if self.queues.contains(&q) {
                        return Signal::Queued(q);
                    }
                }
                Ok(Ok(Signal::Done(_))) if !self.done => {}
                Ok(Ok(other)) => return other,
                Ok(Err(broadcast::error::RecvError::Lagged(_))) => return Signal::Poll,
                Ok(Err(broadcast::error::RecvError::Closed)) => {
                    tokio::time::sleep_until(self.next_poll.into()).await;
                }
            }
        }
    }
}
