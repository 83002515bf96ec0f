//! The runners: long-lived tasks that run the worker's calls, one call at
//! a time each, so that starting a call spawns nothing.
//!
//! A spawn per call cost more than a short handler: tokio allocates each
//! task's cell aligned to 128 bytes and moves the call's future into it,
//! and the task joins the runtime's list of owned tasks, and the set that
//! tracks it, under their locks, and leaves them again as it ends.
//!
//! A started call waits in a queue until a runner takes it. Each queued
//! call has a runner on its way (an idle one woken, or a new one spawned
//! when none is idle), sent by the claim loop that started it, or by a
//! group's runner just before it yields (below), never by a runner about
//! to run a handler: a runner may be about to block its thread in one, and on
//! tokio's multi-thread runtime a task woken from a thread waits in that
//! thread's next-task slot, which other threads cannot steal from. For the
//! same reason a runner whose call ended yields to the scheduler before it
//! takes another: the ended call woke the settlement batcher and the claim
//! loop, and a next call blocking the thread in the same poll would hold
//! them there. So a call that awaits, or blocks its thread, holds up no
//! other, nor what the calls before it woke. After its yield a runner takes
//! the next call queued, if any, whoever was sent for it. The runners
//! number at most the calls ever under way at once, plus those a thread
//! has yet to resume after their yield (tokio resumes a yielded task when
//! its thread runs out of other work, or at its periodic upkeep); idle ones
//! wait for the next call until the worker's run ends.
//!
//! The calls of a handler declared quick (`HandlerOptions::quick`) whose
//! latest calls each ended in their first poll (`pace`) are
//! queued as a group for one runner, which polls each once where it is,
//! one after another with no yield between: a call that ends there woke no
//! runner of its own (a yield per call, measured, cost as much as a runner
//! per call). A call of the group that does not end in that poll goes on,
//! boxed, as a job of its own with a runner sent for it once the whole
//! group has been polled: never just before the next call's poll, which
//! might block the thread (the rule above). A group is at most
//! `GROUP_MAX` calls, of any quick handlers started together. What a
//! quick handler gives up is the isolation above: a call in a group waits
//! for the polls before its own, and one that blocks its thread holds up
//! the rest of its group and what the calls before it woke on that thread
//! (the settlement batcher, the claim loop). That is why a handler must be
//! declared quick, and the calls of one that does not end at once leave
//! the groups.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use futures::FutureExt;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use waymark_store::PgExecutor;

use super::handler::Handlers;
use super::queue::{jobs, Bell, Job, Queue};
use super::run::run_call;
use super::start::{start, Call, Started};
use crate::settle::Settler;
use crate::shared::Shared;

/// The worker's calls and the runners that run them; see the module docs.
/// Dropping it stops the runners (a call under way is dropped, as an
/// aborted task's future would be).
pub(crate) struct Runs<E> {
    inner: Arc<Inner<E>>,
}

struct Inner<E> {
    shared: Arc<Shared<E>>,
    handlers: Arc<Handlers<E>>,
    settler: Settler<E>,
    queue: Mutex<Queue<E>>,
    /// Calls started and not yet ended (queued or under way); `ended`
    /// hears when none is left.
    open: AtomicUsize,
    ended: Notify,
    runners: Mutex<JoinSet<()>>,
    /// Set as the runners stop (with the queue's `closed`): a group's
    /// calls not yet polled are dropped, not run, so that shutdown may give
    /// their tasks back even while a call before them holds the group's
    /// runner in blocking code.
    stopping: AtomicBool,
}

impl<E: PgExecutor + 'static> Runs<E> {
    pub(crate) fn new(shared: Arc<Shared<E>>, handlers: Arc<Handlers<E>>, settler: Settler<E>) -> Self {
        Runs {
            inner: Arc::new(Inner {
                shared,
                handlers,
                settler,
                queue: Mutex::new(Queue::default()),
                open: AtomicUsize::new(0),
                ended: Notify::new(),
                runners: Mutex::new(JoinSet::new()),
                stopping: AtomicBool::new(false),
            }),
        }
    }

    /// Starts a call the claim stage handed over: its slot taken (the
    /// worker's `running_count` counts it from here), ready to queue with
    /// [`Runs::start_all`]; `None` for a call of no task.
    pub(crate) fn start(&self, call: Call) -> Option<Started<E>> {
        start(&self.inner.shared, &self.inner.handlers, call)
    }

    /// Queues started calls for runners, taking them out of `calls` (whose
    /// room the caller keeps for the next), the queue locked once for them
    /// all; the runners they need are woken (or spawned) once it is let
    /// go, so that none finds it held by the waker. Once the runners have
    /// stopped, the calls are dropped instead (which ends them, as an
    /// aborted task's).
    pub(crate) fn start_all(&self, calls: &mut Vec<Started<E>>) {
        if calls.is_empty() {
            return;
        }
        self.inner.open.fetch_add(calls.len(), Ordering::SeqCst);
        let jobs = jobs(calls);
        self.inner.send(jobs);
    }

    /// Until every call started has ended.
    pub(crate) async fn all_ended(&self) {
        loop {
            let ended = self.inner.ended.notified();
            let mut ended = std::pin::pin!(ended);
            ended.as_mut().enable();
            if self.inner.open.load(Ordering::SeqCst) == 0 {
                return;
            }
            ended.await;
        }
    }

    /// Stops the runners: the calls still queued are dropped, those under
    /// way too, as the runners are aborted; waits up to `wait` for the
    /// runners to end. A runner stuck in blocking code never does: it is
    /// left behind.
    pub(crate) async fn abort(&self, wait: Duration) {
        let mut runners = self.inner.stop();
        let _ = tokio::time::timeout(wait, async { while runners.join_next().await.is_some() {} }).await;
    }
}

impl<E> Drop for Runs<E> {
    fn drop(&mut self) {
        // The runners hold the queue (and it them): stopped, they let go.
        drop(self.inner.stop());
    }
}

impl<E: PgExecutor + 'static> Inner<E> {
    /// Queues jobs, each with a runner on its way: an idle one woken, or a
    /// new one, once the queue is let go. Once the runners have stopped,
    /// the jobs are dropped instead, out of the queue's lock.
    fn send(self: &Arc<Self>, jobs: Vec<Job<E>>) {
        if jobs.is_empty() {
            return;
        }
        let mut queue = self.queue();
        if queue.closed {
            drop(queue);
            self.drop_jobs(jobs);
            return;
        }
        queue.calls.extend(jobs);
        let short = queue.calls.len().saturating_sub(queue.sent);
        queue.sent += short;
        let woken = queue.idle.len().min(short);
        let keep = queue.idle.len() - woken;
        let bells = queue.idle.split_off(keep);
        drop(queue);
        for bell in bells.into_iter().rev() {
            bell.ring();
        }
        let spawned = short - woken;
        if spawned > 0 {
            let mut runners = self.runners.lock().unwrap_or_else(|p| p.into_inner());
            for _ in 0..spawned {
                runners.spawn(runner(self.clone()));
            }
        }
    }
}

impl<E> Inner<E> {
    fn queue(&self) -> MutexGuard<'_, Queue<E>> {
        self.queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Closes the queue (its calls dropped, out of its lock), wakes the
    /// idle runners to see it, and aborts the runners, whose set comes back.
    fn stop(&self) -> JoinSet<()> {
        let (dropped, idle): (Vec<Job<E>>, Vec<Arc<Bell>>) = {
            let mut queue = self.queue();
            queue.closed = true;
            self.stopping.store(true, Ordering::SeqCst);
            (queue.calls.drain(..).collect(), std::mem::take(&mut queue.idle))
        };
        for bell in idle {
            bell.ring();
        }
        let mut runners = std::mem::take(&mut *self.runners.lock().unwrap_or_else(|p| p.into_inner()));
        runners.abort_all();
        self.drop_jobs(dropped);
        runners
    }

    /// Drops jobs never to run (out of the queue's lock), each of their
    /// calls ended in the count.
    fn drop_jobs(&self, jobs: Vec<Job<E>>) {
        for job in jobs {
            let unguarded = job.unguarded();
            drop(job);
            for _ in 0..unguarded {
                self.call_ended();
            }
        }
    }

    fn call_ended(&self) {
        if self.open.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.ended.notify_waiters();
        }
    }
}

/// One runner: takes a call, runs it to its end, takes the next; waits
/// for a wakeup when there is none. It starts (and wakes) as a runner
/// sent to the queue.
async fn runner<E: PgExecutor + 'static>(inner: Arc<Inner<E>>) {
    let bell = Arc::new(Bell::default());
    let mut sent = true;
    loop {
        let call = {
            let mut queue = inner.queue();
            if queue.closed {
                return;
            }
            if std::mem::take(&mut sent) {
                queue.sent -= 1;
            }
            let call = queue.calls.pop_front();
            if call.is_none() {
                queue.idle.push(bell.clone());
            }
            call
        };
        let Some(job) = call else {
            bell.heard().await;
            sent = true;
            continue;
        };
        // A panic past the handler's own guard (the worker's code) ends
        // its call only, as it ended its task before.
        match job {
            Job::One(call) => {
                // Ends the call in the count however it ends: returned,
                // panicked, or dropped with this runner.
                let _open = CallOpen(&inner);
                let _ = std::panic::AssertUnwindSafe(run_one(&inner, call)).catch_unwind().await;
            }
            Job::Group(calls) => run_group(&inner, calls),
            Job::Polled(call) => {
                let _ = std::panic::AssertUnwindSafe(call).catch_unwind().await;
            }
        }
        // Back to the scheduler before the next call (see the module docs):
        // what the ended call woke runs first.
        tokio::task::yield_now().await;
    }
}

/// Runs a call to its end, and records its handler's first poll.
async fn run_one<E: PgExecutor + 'static>(inner: &Inner<E>, mut call: Started<E>) {
    let pace = call.take_pace();
    let run = run_call(&inner.shared, &inner.settler, call);
    let Some(pace) = pace else { return run.await };
    let mut run = std::pin::pin!(run);
    let mut first = Some(pace);
    std::future::poll_fn(|cx| {
        let Some(pace) = first.take() else { return run.as_mut().poll(cx) };
        let began = Instant::now();
        let polled = run.as_mut().poll(cx);
        pace.first_poll(polled.is_ready(), began.elapsed());
        polled
    })
    .await;
}

/// Polls each call of a group once, one after another, and records its
/// handler's first poll; a call that did not end goes on as a job of its
/// own, queued as the group ends (see the module docs).
fn run_group<E: PgExecutor + 'static>(inner: &Arc<Inner<E>>, calls: Vec<Started<E>>) {
    let mut left = Left { calls: calls.into_iter(), inner };
    let mut waiting = Vec::new();
    // Woken by nothing: a call that did not end is polled again by the
    // runner that takes it, whatever happened meanwhile.
    let mut cx = Context::from_waker(Waker::noop());
    // The box of a call that ended, for the next call: a call's future is
    // over a kilobyte, and allocating one per call cost more than the
    // rest of a no-op call's run.
    let mut spare = None;
    // Once the runners stop, the calls left are never run, as queued calls
    // are dropped (see `stopping`): they go with `left`.
    while !inner.stopping.load(Ordering::SeqCst) {
        let Some(mut call) = left.calls.next() else { break };
        let pace = call.take_pace();
        let next = grouped_call(Open(inner.clone()), call);
        let mut run = match spare.take() {
            Some(mut boxed) => {
                Pin::set(&mut boxed, next);
                boxed
            }
            None => Box::pin(next),
        };
        // Counted before the poll, so that a test that sees the call's
        // settlement sees it counted.
        #[cfg(feature = "test-hooks")]
        inner.shared.state.grouped_calls.fetch_add(1, Ordering::Relaxed);
        let began = Instant::now();
        // Outside tokio's budget: the group's calls share one poll of this
        // runner, and a call late in it could find the budget spent by
        // those before and seem to await. (A call that runs long for want
        // of the budget's forced yields is still seen, by its time.)
        let mut first = tokio::task::unconstrained(run.as_mut());
        let polled =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| Pin::new(&mut first).poll(&mut cx)));
        let ended = !matches!(polled, Ok(Poll::Pending));
        if let Some(pace) = pace {
            pace.first_poll(ended, began.elapsed());
        }
        // Ended, or panicked (the worker's code): its guard went as it
        // returned or unwound, ending it in the count; the spent future's
        // box goes to the next call.
        if ended {
            spare = Some(run);
        } else {
            waiting.push(Job::Polled(run));
        }
    }
    drop(left);
    inner.send(waiting);
}

/// A grouped call, which ends in the count as it returns, unwinds, or is
/// dropped unrun.
async fn grouped_call<E: PgExecutor + 'static>(open: Open<E>, call: Started<E>) {
    run_call(&open.0.shared, &open.0.settler, call).await;
}

/// A group's calls not yet polled: dropped unrun as the runners stop,
/// each ends in the count.
struct Left<'a, E> {
    calls: std::vec::IntoIter<Started<E>>,
    inner: &'a Inner<E>,
}

impl<E> Drop for Left<'_, E> {
    fn drop(&mut self) {
        for call in self.calls.by_ref() {
            drop(call);
            self.inner.call_ended();
        }
    }
}

/// Ends a call in the count as it drops: a polled call's, inside its
/// future.
struct Open<E>(Arc<Inner<E>>);

impl<E> Drop for Open<E> {
    fn drop(&mut self) {
        self.0.call_ended();
    }
}

struct CallOpen<'a, E>(&'a Inner<E>);

impl<E> Drop for CallOpen<'_, E> {
    fn drop(&mut self) {
        self.0.call_ended();
    }
}
