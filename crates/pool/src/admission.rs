//! The admission gate: at most `permits` calls hold a connection at once,
//! at most `max_waiting` wait for one, in two lanes.
//!
//! Critical work (heartbeats, settlements) goes before ordinary work
//! (submits, claims, reads), but may pass at most one waiting ordinary
//! request in a row, so a burst of submits can starve neither lease renewal
//! nor itself.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;
use waymark_store::Lane;

/// Why a caller was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// `max_waiting` callers were already waiting.
    QueueFull { waiting: usize },
    /// No permit came free within the acquire timeout.
    TimedOut { waiting: usize },
}

#[derive(Debug)]
struct Waiter {
    id: u64,
    grant: oneshot::Sender<()>,
}

#[derive(Debug, Default)]
struct State {
    available: usize,
    critical: VecDeque<Waiter>,
    ordinary: VecDeque<Waiter>,
    /// Critical grants made in a row while an ordinary caller waited.
    passed_ordinary: u32,
    next_id: u64,
    in_use: usize,
    peak_in_use: usize,
    peak_waiting: usize,
}

impl State {
    fn waiting(&self) -> usize {
        self.critical.len() + self.ordinary.len()
    }

    /// The next waiter to serve, by the lane rule.
    fn next_waiter(&mut self) -> Option<Waiter> {
        let take_critical = match (self.critical.is_empty(), self.ordinary.is_empty()) {
            (true, true) => return None,
            (false, true) => true,
            (true, false) => false,
            (false, false) => self.passed_ordinary < 1,
        };
        if take_critical {
            if !self.ordinary.is_empty() {
                self.passed_ordinary += 1;
            }
            self.critical.pop_front()
        } else {
            self.passed_ordinary = 0;
            self.ordinary.pop_front()
        }
    }

    fn remove(&mut self, id: u64) -> bool {
        for queue in [&mut self.critical, &mut self.ordinary] {
            if let Some(i) = queue.iter().position(|w| w.id == id) {
                queue.remove(i);
                return true;
            }
        }
        false
    }
}

/// The gate; cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Gate {
    state: Arc<Mutex<State>>,
    max_waiting: usize,
    acquire_timeout: Duration,
}

/// A held permit; dropping it admits the next waiter.
#[derive(Debug)]
pub(crate) struct Permit {
    gate: Gate,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.gate.release();
    }
}

/// Removes a waiter whose caller gave up (its future was dropped).
struct Leave<'a> {
    gate: &'a Gate,
    id: u64,
    armed: bool,
}

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        if self.armed {
            let mut st = self.gate.lock();
            if !st.remove(self.id) {
                // The grant raced with the cancellation: pass it on.
                drop(st);
                self.gate.release();
            }
        }
    }
}

impl Gate {
    pub(crate) fn new(permits: usize, max_waiting: usize, acquire_timeout: Duration) -> Self {
        let state = State { available: permits, ..State::default() };
        Gate { state: Arc::new(Mutex::new(state)), max_waiting, acquire_timeout }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for a permit in `lane`, or refuses at once when the queue is
    /// full, or after the acquire timeout.
    pub(crate) async fn admit(&self, lane: Lane) -> Result<Permit, Refusal> {
        // `granted` is declared before `leave` so that it is dropped after
        // it: when the caller gives up, `leave` still finds a grant that was
        // already sent in the channel and passes it on.
        let (id, mut granted) = {
            let mut st = self.lock();
            if st.available > 0 && st.waiting() == 0 {
                st.available -= 1;
                st.in_use += 1;
                st.peak_in_use = st.peak_in_use.max(st.in_use);
                return Ok(Permit { gate: self.clone() });
            }
            let waiting = st.waiting();
            if waiting >= self.max_waiting {
                return Err(Refusal::QueueFull { waiting });
            }
            let (tx, rx) = oneshot::channel();
            st.next_id += 1;
            let id = st.next_id;
            let waiter = Waiter { id, grant: tx };
            match lane {
                Lane::Critical => st.critical.push_back(waiter),
                Lane::Ordinary => st.ordinary.push_back(waiter),
            }
            st.peak_waiting = st.peak_waiting.max(st.waiting());
            (id, rx)
        };
        let mut leave = Leave { gate: self, id, armed: true };
        let outcome = tokio::time::timeout(self.acquire_timeout, &mut granted).await;
        leave.armed = false;
        match outcome {
            Ok(_) => Ok(Permit { gate: self.clone() }),
            Err(_) => {
                let mut st = self.lock();
                if st.remove(id) {
                    Err(Refusal::TimedOut { waiting: st.waiting() })
                } else {
                    // Granted at the same moment the timeout fired: keep it.
                    Ok(Permit { gate: self.clone() })
                }
            }
        }
    }

    fn release(&self) {
        let mut st = self.lock();
        loop {
            match st.next_waiter() {
                Some(w) => {
                    if w.grant.send(()).is_ok() {
                        st.peak_in_use = st.peak_in_use.max(st.in_use);
                        return;
                    }
                    // That caller is gone; try the next.
                }
                None => {
                    st.available += 1;
                    st.in_use -= 1;
                    return;
                }
            }
        }
    }

    /// (in use, waiting, peak in use, peak waiting).
    pub(crate) fn snapshot(&self) -> (usize, usize, usize, usize) {
        let st = self.lock();
        (st.in_use, st.waiting(), st.peak_in_use, st.peak_waiting)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(permits: usize, waiting: usize) -> Gate {
        Gate::new(permits, waiting, Duration::from_secs(5))
    }

    #[tokio::test]
    async fn full_queue_is_refused_at_once() {
        let g = gate(1, 1);
        let _held = g.admit(Lane::Ordinary).await.expect("first");
        let g2 = g.clone();
        let waiter = tokio::spawn(async move { g2.admit(Lane::Ordinary).await.map(|_| ()) });
        tokio::task::yield_now().await;
        while g.snapshot().1 < 1 {
            tokio::task::yield_now().await;
        }
        assert_eq!(g.admit(Lane::Critical).await.map(|_| ()), Err(Refusal::QueueFull { waiting: 1 }));
        drop(_held);
        waiter.await.expect("join").expect("admitted");
    }

    #[tokio::test(start_paused = true)]
    async fn waiting_past_the_timeout_is_refused_and_leaves_the_queue() {
        let g = Gate::new(1, 10, Duration::from_millis(100));
        let held = g.admit(Lane::Ordinary).await.expect("first");
        let refused = g.admit(Lane::Ordinary).await.map(|_| ());
        assert_eq!(refused, Err(Refusal::TimedOut { waiting: 0 }));
        assert_eq!(g.snapshot().1, 0, "the timed-out waiter left the queue");
        drop(held);
        let _again = g.admit(Lane::Ordinary).await.expect("the permit came back");
    }

    #[tokio::test]
    async fn a_dropped_waiter_leaves_the_queue() {
        let g = gate(1, 10);
        let held = g.admit(Lane::Ordinary).await.expect("first");
        {
            let fut = g.admit(Lane::Ordinary);
            tokio::pin!(fut);
            assert!(futures::poll!(fut.as_mut()).is_pending());
            assert_eq!(g.snapshot().1, 1);
        }
        assert_eq!(g.snapshot().1, 0);
        drop(held);
        assert_eq!(g.snapshot().0, 0, "no permit leaked");
    }

    #[tokio::test]
    async fn critical_passes_at_most_one_ordinary_in_a_row() {
        let g = gate(1, 100);
        let held = g.admit(Lane::Ordinary).await.expect("first");
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        // Queue: o1 o2 then c1 c2 c3.
        for (name, lane) in [
            ("o1", Lane::Ordinary),
            ("o2", Lane::Ordinary),
            ("c1", Lane::Critical),
            ("c2", Lane::Critical),
            ("c3", Lane::Critical),
        ] {
            let (gate, order) = (g.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let permit = gate.admit(lane).await.expect("admitted");
                order.lock().expect("order").push(name);
                tokio::task::yield_now().await;
                drop(permit);
            }));
            while g.snapshot().1 < tasks.len() {
                tokio::task::yield_now().await;
            }
        }
        drop(held);
        for t in tasks {
            t.await.expect("join");
        }
        assert_eq!(*order.lock().expect("order"), ["c1", "o1", "c2", "o2", "c3"]);
    }
}
