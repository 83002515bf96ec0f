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
//! when none is idle), sent by the claim loop that started it, never by a
//! runner: a runner may be about to block its thread in a handler, and on
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

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::task::AtomicWaker;
use futures::FutureExt;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use waymark_store::PgExecutor;

use crate::run::{run_call, Started};
use crate::settle::Settler;
use crate::worker::Shared;

/// The worker's calls and the runners that run them; see the module docs.
/// Dropping it stops the runners (a call under way is dropped, as an
/// aborted task's future would be).
pub(crate) struct Runs<E> {
    inner: Arc<Inner<E>>,
}

struct Inner<E> {
    shared: Arc<Shared<E>>,
    settler: Settler<E>,
    queue: Mutex<Queue<E>>,
    /// Calls started and not yet ended (queued or under way); `ended`
    /// hears when none is left.
    open: AtomicUsize,
    ended: Notify,
    runners: Mutex<JoinSet<()>>,
}

struct Queue<E> {
    calls: VecDeque<Started<E>>,
    /// Runners waiting for a wakeup, the latest to wait last.
    idle: Vec<Arc<Bell>>,
    /// Runners on their way to the queue (woken, or just spawned) that have
    /// not yet looked: each queued call has one.
    sent: usize,
    /// The runners are stopping: no call is taken or started any more.
    closed: bool,
}

impl<E: PgExecutor + 'static> Runs<E> {
    pub(crate) fn new(shared: Arc<Shared<E>>, settler: Settler<E>) -> Self {
        Runs {
            inner: Arc::new(Inner {
                shared,
                settler,
                queue: Mutex::new(Queue { calls: VecDeque::new(), idle: Vec::new(), sent: 0, closed: false }),
                open: AtomicUsize::new(0),
                ended: Notify::new(),
                runners: Mutex::new(JoinSet::new()),
            }),
        }
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
        let count = calls.len();
        self.inner.open.fetch_add(count, Ordering::SeqCst);
        let mut queue = self.inner.queue();
        if queue.closed {
            drop(queue);
            calls.clear();
            for _ in 0..count {
                self.inner.call_ended();
            }
            return;
        }
        queue.calls.extend(calls.drain(..));
        // Each queued call has a runner on its way: an idle one, or new.
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
            let mut runners = self.inner.runners.lock().unwrap_or_else(|p| p.into_inner());
            for _ in 0..spawned {
                runners.spawn(runner(self.inner.clone()));
            }
        }
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

impl<E> Inner<E> {
    fn queue(&self) -> MutexGuard<'_, Queue<E>> {
        self.queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Closes the queue (its calls dropped, out of its lock), wakes the
    /// idle runners to see it, and aborts the runners, whose set comes back.
    fn stop(&self) -> JoinSet<()> {
        let (dropped, idle): (Vec<Started<E>>, Vec<Arc<Bell>>) = {
            let mut queue = self.queue();
            queue.closed = true;
            (queue.calls.drain(..).collect(), std::mem::take(&mut queue.idle))
        };
        for bell in idle {
            bell.ring();
        }
        let mut runners = std::mem::take(&mut *self.runners.lock().unwrap_or_else(|p| p.into_inner()));
        runners.abort_all();
        for call in dropped {
            drop(call);
            self.call_ended();
        }
        runners
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
        let Some(call) = call else {
            bell.heard().await;
            sent = true;
            continue;
        };
        {
            // Ends the call in the count however it ends: returned,
            // panicked, or dropped with this runner.
            let _open = CallOpen(&inner);
            // A panic past the handler's own guard (the worker's code)
            // ends this call only, as it ended its task before.
            let _ = std::panic::AssertUnwindSafe(run_call(&inner.shared, &inner.settler, call))
                .catch_unwind()
                .await;
        }
        // Back to the scheduler before the next call (see the module docs):
        // what the ended call woke runs first.
        tokio::task::yield_now().await;
    }
}

/// How an idle runner is woken: rung once by whoever takes it off the
/// idle list (a call to take, or the runners stopping).
#[derive(Default)]
struct Bell {
    rung: AtomicBool,
    waker: AtomicWaker,
}

impl Bell {
    fn ring(&self) {
        self.rung.store(true, Ordering::Release);
        self.waker.wake();
    }

    /// Until rung; the ring is spent.
    async fn heard(&self) {
        std::future::poll_fn(|cx| {
            // Registered before the check: a ring between the two is seen.
            self.waker.register(cx.waker());
            match self.rung.swap(false, Ordering::AcqRel) {
                true => std::task::Poll::Ready(()),
                false => std::task::Poll::Pending,
            }
        })
        .await;
    }
}

struct CallOpen<'a, E>(&'a Inner<E>);

impl<E> Drop for CallOpen<'_, E> {
    fn drop(&mut self) {
        self.0.call_ended();
    }
}
