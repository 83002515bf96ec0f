//! Waiting for results and watching queues: polling, cut short by LISTEN.
//!
//! Every wait registers for the task's done signal *before* it reads the
//! row, re-reads on each signal, and re-reads on a backstop timer (100 ms
//! growing 1.5x to 500 ms, as protocol v1 says) whether or not a signal
//! came. So a notification lost on the way, or sent between the read and
//! the wait, costs at most one backstop interval; without any listener the
//! wait still finishes, by polling.
//!
//! A wait answers terminal rows only. Its probe reads the id and status, and
//! a full read follows once the probe says terminal; a re-read that finds
//! the task queued again (a `retry` landed between the two) or gone (a
//! purge) is no answer, and the wait goes on, as cairnq's does.

use std::future::Future;
use std::time::{Duration, Instant};

use tokio::sync::broadcast;

use crate::error::{Error, Result};
use crate::executor::PgExecutor;
use crate::new_task::NewTask;
use crate::signals::{Channel, Signal};
use crate::store::Store;
use crate::task::{Task, TaskState, TaskStatus};

const FIRST_BACKSTOP: Duration = Duration::from_millis(100);
const MAX_BACKSTOP: Duration = Duration::from_millis(500);

/// The backstop after `current`: x1.5, at most [`MAX_BACKSTOP`].
fn grow(current: Duration) -> Duration {
    (current * 3 / 2).min(MAX_BACKSTOP)
}

/// A wait's read that failed for a passing reason (the pool saturated, its
/// breaker open, a lost connection, a timeout) is tried again on the next
/// backstop rather than failing the wait: `Ok(None)`. Anything else fails it.
fn transient<T>(probe: Result<T>) -> Result<Option<T>> {
    use crate::executor::ExecErrorKind::*;
    match probe {
        Ok(v) => Ok(Some(v)),
        Err(e)
            if matches!(e.exec_kind(), Some(Saturated | CircuitOpen | Connection | Timeout | Capacity)) =>
        {
            tracing::debug!(error = %e, "wait read failed; trying again on the backstop");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// What one turn of a wait found.
#[derive(Debug)]
enum Found {
    /// No task under the id, or the key names none.
    Nothing,
    /// Task `id`, not done: live when probed, or moved on between the probe
    /// and the full re-read. `row` is the full row, when the turn read one.
    Pending { id: String, row: Option<Task> },
    /// The task, terminal by its full row.
    Done(Task),
}

/// The full re-read that follows a probe which found task `id` terminal
/// (`None`: gone, or the read could not run). A `retry` landing between the
/// two reads queues the task again, a purge deletes it: neither is an end
/// to answer, so the wait goes on, as cairnq's does.
fn reread(id: String, row: Option<Task>) -> Found {
    match row {
        Some(task) if task.status.is_terminal() => Found::Done(task),
        row => Found::Pending { id, row },
    }
}

impl<E: PgExecutor> Store<E> {
    /// Waits until task `id` is terminal and returns it, whatever its end
    /// (succeeded, failed or canceled); never a row that is not terminal.
    ///
    /// Past `timeout` it fails with [`Error::TaskTimeout`], which carries
    /// the task as one last full read finds it; the task is not stopped. An
    /// id that the first read does not find fails at once with
    /// [`Error::NotFound`]: it never existed, or was purged before the wait
    /// began. A task the wait has seen and that then vanishes (purged while
    /// it waits) is waited for until the timeout, as cairnq does: the
    /// timeout then carries no snapshot.
    pub async fn wait(&self, id: &str, timeout: Duration) -> Result<Task> {
        let started = Instant::now();
        let mut subscription = self.signals.subscribe_done(id);
        self.signals.ensure_listening(self.executor(), &self.life, Channel::Done).await;
        let mut backstop = FIRST_BACKSTOP;
        let (mut seen, mut last) = (false, None);
        loop {
            match self.turn(self.get_status(id)).await? {
                Some(Found::Done(task)) => return Ok(task),
                Some(Found::Nothing) if !seen => return Err(Error::NotFound { what: format!("task {id}") }),
                Some(Found::Pending { row, .. }) => {
                    seen = true;
                    last = row.or(last);
                }
                // Gone after it was seen, or the probe could not run: wait on.
                Some(Found::Nothing) | None => {}
            }
            let left = timeout.saturating_sub(started.elapsed());
            if left.is_zero() {
                return self.timed_out(self.get(id), id.to_owned(), started, last).await;
            }
            subscription.wait(backstop.min(left)).await;
            backstop = grow(backstop);
            self.signals.ensure_listening(self.executor(), &self.life, Channel::Done).await;
        }
    }

    /// Waits for the task the key names, re-resolving the key at each probe
    /// (a `replace` may point it at a new task meanwhile). A key that names
    /// no task, yet or any more, is waited for like a task that is not done:
    /// the task a later submit under it makes is the one waited for. Past
    /// `timeout`, [`Error::TaskTimeout`] names the task the key named last
    /// (`key "..."` if it never named one).
    pub async fn wait_by_key(&self, key: &str, timeout: Duration) -> Result<Task> {
        let started = Instant::now();
        let mut subscription = None;
        let mut last = None;
        let mut backstop = FIRST_BACKSTOP;
        loop {
            match self.turn(self.get_status_by_key(key)).await? {
                Some(Found::Done(task)) => return Ok(task),
                Some(Found::Pending { id, row }) => {
                    last = row.or(last);
                    // Register for the task the key names now; if that
                    // changed, the next probe is the re-read that a
                    // registration must precede.
                    if subscription.as_ref().is_none_or(|(current, _)| *current != id) {
                        subscription = Some((id.clone(), self.signals.subscribe_done(&id)));
                        self.signals.ensure_listening(self.executor(), &self.life, Channel::Done).await;
                        continue;
                    }
                }
                // No task under the key, or the probe could not run: wait on.
                Some(Found::Nothing) | None => {}
            }
            let left = timeout.saturating_sub(started.elapsed());
            if left.is_zero() {
                let task_id =
                    subscription.as_ref().map_or_else(|| format!("key {key:?}"), |(id, _)| id.clone());
                return self.timed_out(self.get_by_key(key), task_id, started, last).await;
            }
            match subscription.as_mut() {
                Some((_, s)) => {
                    s.wait(backstop.min(left)).await;
                    self.signals.ensure_listening(self.executor(), &self.life, Channel::Done).await;
                }
                // Nothing to be signalled about (a submit sends no done
                // signal): the backstop finds the task the key comes to name.
                None => tokio::time::sleep(backstop.min(left)).await,
            }
            backstop = grow(backstop);
        }
    }

    /// One turn of a wait, under the probe semaphore: the cheap probe, and
    /// the full row only once the probe finds the task terminal. `Ok(None)`:
    /// the probe failed for a passing reason; try again on the backstop.
    async fn turn(&self, probe: impl Future<Output = Result<Option<TaskState>>>) -> Result<Option<Found>> {
        let _turn = self.signals.probes.acquire().await.expect("the probe semaphore is never closed");
        let state = match transient(probe.await)? {
            None => return Ok(None),
            Some(None) => return Ok(Some(Found::Nothing)),
            Some(Some(state)) => state,
        };
        if !state.status.is_terminal() {
            return Ok(Some(Found::Pending { id: state.id, row: None }));
        }
        // A re-read that cannot run now leaves the task pending, like one
        // that finds it gone: the next turn looks again.
        let row = transient(self.get(&state.id).await)?.flatten();
        Ok(Some(reread(state.id, row)))
    }

    /// The end of a wait whose time is up: one full read (once per wait), so
    /// that [`Error::TaskTimeout`] carries the task as it is now rather than
    /// the probe's bare status; if that read cannot run, the last full row
    /// the wait read. A task that ended meanwhile is the answer after all.
    async fn timed_out(
        &self,
        read: impl Future<Output = Result<Option<Task>>>,
        task_id: String,
        started: Instant,
        last: Option<Task>,
    ) -> Result<Task> {
        let now = {
            let _turn = self.signals.probes.acquire().await.expect("the probe semaphore is never closed");
            transient(read.await)?
        };
        let last = match now {
            Some(Some(task)) if task.status.is_terminal() => return Ok(task),
            Some(now) => now,
            None => last,
        };
        let task_id = last.as_ref().map_or(task_id, |task| task.id.clone());
        Err(Error::TaskTimeout { task_id, waited: started.elapsed(), last: last.map(Box::new) })
    }

    /// Submits `task` and waits for its end: `Ok` with the succeeded task,
    /// [`Error::TaskFailed`] with its envelope, [`Error::TaskCanceled`], or
    /// [`Error::TaskTimeout`] (the task keeps running). A result or error
    /// the store cannot read ([`Task::unreadable`]) is
    /// [`Error::UnreadableAnswer`], naming the task, its status and the column.
    pub async fn call(&self, task: NewTask, timeout: Duration) -> Result<Task> {
        let submitted = self.submit(task).await?;
        let done = self.wait(&submitted.id, timeout).await?;
        // An answer that cannot be read is not an answer of `None`.
        let answer = match done.status {
            TaskStatus::Succeeded => Some("result"),
            TaskStatus::Failed => Some("error"),
            _ => None,
        };
        if let Some(u) = answer.and_then(|column| done.unreadable_column(column)) {
            return Err(Error::UnreadableAnswer {
                task_id: done.id.clone(),
                status: done.status,
                column: u.column.clone(),
                reason: u.reason.clone(),
            });
        }
        match done.status {
            TaskStatus::Succeeded => Ok(done),
            TaskStatus::Failed => {
                Err(Error::TaskFailed { error: done.error_envelope().map(Box::new), task_id: done.id })
            }
            // `wait` answers terminal rows only: this one is canceled.
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

    /// [`Store::watch`] of every queue, those that appear later included:
    /// a dashboard's or an operator's view.
    pub fn watch_every_queue(&self, poll_interval: Duration) -> Watch<'_, E> {
        let mut watch = self.watch_with(Vec::<String>::new(), poll_interval, true);
        watch.every_queue = true;
        watch
    }

    fn watch_with<I, S>(&self, queues: I, poll_interval: Duration, done: bool) -> Watch<'_, E>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        // Within a day: a longer interval is no poll at all, and would
        // overflow `Instant`.
        let poll_interval = poll_interval.clamp(Duration::from_millis(1), Duration::from_secs(86_400));
        Watch {
            store: self,
            queues: queues.into_iter().map(Into::into).collect(),
            every_queue: false,
            done,
            events: self.signals.events(),
            poll_interval,
            next_poll: Instant::now() + poll_interval,
            poll_owed: true,
        }
    }

    /// Whether waits are pushed now: the store consumes a `cairnq_done`
    /// LISTEN stream (the first wait starts it). False means waits poll.
    pub fn is_listening(&self) -> bool {
        self.signals.is_listening(Channel::Done)
    }

    /// Whether queue watches are pushed now: the store consumes a
    /// `cairnq_queued` LISTEN stream (the first watch starts it). False
    /// means watches poll.
    pub fn is_watching(&self) -> bool {
        self.signals.is_listening(Channel::Queued)
    }
}

/// A watch over some queues; see [`Store::watch`].
#[derive(Debug)]
pub struct Watch<'a, E> {
    store: &'a Store<E>,
    queues: Vec<String>,
    /// Every queue, whatever `queues` says.
    every_queue: bool,
    /// Whether done signals are wanted (and `cairnq_done` listened to).
    done: bool,
    events: broadcast::Receiver<Signal>,
    poll_interval: Duration,
    next_poll: Instant,
    /// A poll to answer once the listener is asked for: set before that
    /// await and cleared after it, so a caller that drops `next` there (a
    /// `select!` whose other branch won) still gets the poll at its next
    /// call. Set at the start: the first call answers a poll.
    poll_owed: bool,
}

impl<E: PgExecutor> Watch<'_, E> {
    async fn listen(&self) {
        let (signals, exec, life) = (&self.store.signals, self.store.executor(), &self.store.life);
        signals.ensure_listening(exec, life, Channel::Queued).await;
        if self.done {
            signals.ensure_listening(exec, life, Channel::Done).await;
        }
    }

    /// Drops the signals already waiting and answers how many there were:
    /// a consumer that re-reads everything once per wake (a dashboard)
    /// then takes one read for a burst, not one per task.
    pub fn skip_pending(&mut self) -> usize {
        let mut skipped = 0;
        loop {
            match self.events.try_recv() {
                Ok(_) => skipped += 1,
                Err(broadcast::error::TryRecvError::Lagged(n)) => skipped += n as usize,
                Err(_) => return skipped,
            }
        }
    }

    /// The next signal. The first call answers [`Signal::Poll`] at once, so
    /// the caller reads before it waits.
    ///
    /// Cancel safe: a call dropped before it answered loses no signal; a
    /// poll it was about to answer comes at the next call.
    pub async fn next(&mut self) -> Signal {
        loop {
            if self.poll_owed {
                self.listen().await;
                self.poll_owed = false;
                return Signal::Poll;
            }
            let now = Instant::now();
            if now >= self.next_poll {
                self.next_poll = now + self.poll_interval;
                self.poll_owed = true;
                continue;
            }
            let signal = tokio::time::timeout(self.next_poll - now, self.events.recv()).await;
            match signal {
                Err(_) => continue, // the poll timer; answered above
                Ok(Ok(Signal::Queued(q))) => {
                    if self.every_queue || self.queues.contains(&q) {
                        return Signal::Queued(q);
                    }
                }
                Ok(Ok(Signal::Done(_))) if !self.done => {}
                // A stream that ended (or came back) says so with a poll:
                // listen again now, not at the next poll of the timer.
                Ok(Ok(Signal::Poll)) => self.poll_owed = true,
                Ok(Ok(other)) => return other,
                Ok(Err(broadcast::error::RecvError::Lagged(_))) => return Signal::Poll,
                Ok(Err(broadcast::error::RecvError::Closed)) => {
                    tokio::time::sleep_until(self.next_poll.into()).await;
                }
            }
        }
    }
}
