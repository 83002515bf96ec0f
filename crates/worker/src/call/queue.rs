//! What waits for a runner: jobs (a call, a group of quick calls, a call
//! of a group that went on), the queue they wait in, and the bell that
//! wakes an idle runner.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures::task::AtomicWaker;

use super::start::Started;

/// The most calls in one group: what a call in a group may wait behind.
const GROUP_MAX: usize = 32;

/// What a runner takes from the queue.
pub(super) enum Job<E> {
    /// A call, run to its end.
    One(Started<E>),
    /// Calls whose handlers end at once, polled once each (see the module
    /// docs).
    Group(Vec<Started<E>>),
    /// A call of a group that did not end in its first poll, run to its
    /// end; it ends in the count as it drops, wherever that is.
    Polled(Pin<Box<dyn Future<Output = ()> + Send>>),
}

impl<E> Job<E> {
    /// Its calls that end in the count only when a runner runs them (a
    /// polled call's guard goes with its future).
    pub(super) fn unguarded(&self) -> usize {
        match self {
            Job::One(_) => 1,
            Job::Group(calls) => calls.len(),
            Job::Polled(_) => 0,
        }
    }
}

pub(super) struct Queue<E> {
    pub(super) calls: VecDeque<Job<E>>,
    /// Runners waiting for a wakeup, the latest to wait last.
    pub(super) idle: Vec<Arc<Bell>>,
    /// Runners on their way to the queue (woken, or just spawned) that have
    /// not yet looked: each queued call has one.
    pub(super) sent: usize,
    /// The runners are stopping: no call is taken or started any more.
    pub(super) closed: bool,
}

impl<E> Default for Queue<E> {
    fn default() -> Self {
        Queue { calls: VecDeque::new(), idle: Vec::new(), sent: 0, closed: false }
    }
}

/// Started calls as jobs for the runners, taking them out of `calls`: the
/// calls of quick handlers that end at once go as groups of up to
/// [`GROUP_MAX`], the others one a job.
pub(super) fn jobs<E>(calls: &mut Vec<Started<E>>) -> Vec<Job<E>> {
    let mut jobs = Vec::with_capacity(calls.len());
    let mut group = Vec::new();
    for call in calls.drain(..) {
        match call.groups() {
            true => group.push(call),
            false => jobs.push(Job::One(call)),
        }
    }
    while !group.is_empty() {
        let rest = group.split_off(group.len().min(GROUP_MAX));
        match group.len() {
            1 => jobs.extend(group.pop().map(Job::One)),
            _ => jobs.push(Job::Group(group)),
        }
        group = rest;
    }
    jobs
}

/// How an idle runner is woken: rung once by whoever takes it off the
/// idle list (a call to take, or the runners stopping).
#[derive(Default)]
pub(super) struct Bell {
    rung: AtomicBool,
    waker: AtomicWaker,
}

impl Bell {
    pub(super) fn ring(&self) {
        self.rung.store(true, Ordering::Release);
        self.waker.wake();
    }

    /// Until rung; the ring is spent.
    pub(super) async fn heard(&self) {
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
