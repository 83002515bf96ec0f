//! Named resources and per-handler limits: how many calls may hold each at
//! once on this worker. A claim reserves its units before it draws, so the
//! worker never claims a task it could not start, and a call gives its unit
//! back when it ends (settled or given back), however it ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use waymark_store::Error;

/// Options of one handler registration; see [`WorkerBuilder::task_with`].
///
/// [`WorkerBuilder::task_with`]: crate::WorkerBuilder::task_with
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HandlerOptions {
    pub(crate) resource: Option<String>,
    pub(crate) max_running: Option<usize>,
    pub(crate) quick: bool,
}

impl HandlerOptions {
    /// No limits beyond the worker's concurrency.
    pub fn new() -> Self {
        HandlerOptions::default()
    }

    /// Each call of this handler holds one unit of the worker's resource
    /// `name` (declared with [`WorkerBuilder::resource`]) while it runs,
    /// shared with every handler that names it: at capacity 1, the
    /// handlers naming it never run at once. Defaults to none.
    ///
    /// [`WorkerBuilder::resource`]: crate::WorkerBuilder::resource
    pub fn resource(mut self, name: impl Into<String>) -> Self {
        self.resource = Some(name.into());
        self
    }

    /// At most `n` calls of this handler at once on this worker. Defaults
    /// to the worker's concurrency.
    pub fn max_running(mut self, n: usize) -> Self {
        self.max_running = Some(n);
        self
    }

    /// Declares the handler quick: its calls end within their first poll,
    /// in well under 100 µs, or await, and never block their thread. The
    /// worker then runs its calls a group at a time (up to 32 on one
    /// runner, each polled once, one after another) instead of waking a
    /// runner per call, which spares a short handler part of the worker's
    /// cost per call (15 to 17 % of the worker's CPU for a no-op handler;
    /// docs/benchmarks.md, "An eighth pass"). Its calls join groups only
    /// after sixteen in a row have ended in their first poll. A call that
    /// awaits in its first poll goes on on a runner of its own, once the
    /// rest of its group has been polled, and sends the handler's next
    /// calls to a runner each until it has shown again that they end at
    /// once; so do first polls longer than about 100 µs (one of them is
    /// forgiven after a long run of quick ones). Calls already in a group
    /// run there still. A worker that settles each task on its own
    /// (`settle_batch(1, _)`) gains nothing: every call awaits its
    /// settlement.
    ///
    /// The price, if the declaration is wrong: a call that blocks its
    /// thread holds up the calls after it in its group (calls of any quick
    /// handler started with it, and one before it that awaited), and a
    /// task that the calls before it woke (the settlement batcher, the
    /// claim loop) can wait on that thread until it returns. Undeclared,
    /// each call has a runner of its own and a blocking call holds up no
    /// other. Defaults to off; ignored for blocking and batch handlers.
    pub fn quick(mut self) -> Self {
        self.quick = true;
        self
    }
}

/// The worker's capacities: each declared resource, and each handler's
/// own `max_running`, by index.
#[derive(Debug, Default)]
pub(crate) struct Capacities {
    /// (what it is, its capacity, units held), by index.
    slots: Mutex<Vec<(String, usize, usize)>>,
}

impl Capacities {
    /// The capacities and, for each resource name, its index.
    pub(crate) fn new(resources: &HashMap<String, usize>) -> (Capacities, HashMap<String, usize>) {
        let mut names: Vec<&String> = resources.keys().collect();
        names.sort();
        let index = names.iter().enumerate().map(|(i, n)| ((*n).clone(), i)).collect();
        let slots = names.iter().map(|n| (format!("resource {n:?}"), resources[*n], 0)).collect();
        (Capacities { slots: Mutex::new(slots) }, index)
    }

    /// Adds a capacity (a handler's own limit) and returns its index.
    pub(crate) fn add(&self, what: String, capacity: usize) -> usize {
        let mut slots = self.slots.lock().expect("capacities lock");
        slots.push((what, capacity, 0));
        slots.len() - 1
    }

    /// Reserves up to `want` units of every capacity in `of` (as many as
    /// the fullest of them has left).
    pub(crate) fn reserve(self: &Arc<Self>, of: &Arc<[usize]>, want: usize) -> Units {
        if of.is_empty() {
            return Units { held: None, n: want };
        }
        let mut slots = self.slots.lock().expect("capacities lock");
        let n = of.iter().map(|&i| slots[i].1.saturating_sub(slots[i].2)).min().unwrap_or(0).min(want);
        for &i in of.iter() {
            slots[i].2 += n;
        }
        Units { held: Some((self.clone(), of.clone())), n }
    }

    fn release(&self, of: &[usize], n: usize) {
        if n == 0 {
            return;
        }
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        for &i in of {
            slots[i].2 = slots[i].2.saturating_sub(n);
        }
    }
}

/// Reserved units; given back on drop.
#[derive(Debug)]
pub(crate) struct Units {
    /// The capacities they count against; none without limits (nothing
    /// to give back, and no shared count touched per call).
    held: Option<(Arc<Capacities>, Arc<[usize]>)>,
    n: usize,
}

impl Units {
    pub(crate) fn count(&self) -> usize {
        self.n
    }

    /// Whether these units hold any capacity (a resource or a handler's
    /// `max_running`): a draw without limits counts its calls in units of
    /// nothing.
    pub(crate) fn hold_capacity(&self) -> bool {
        self.n > 0 && self.held.is_some()
    }

    /// Moves one unit out, for one call.
    pub(crate) fn take_one(&mut self) -> Units {
        debug_assert!(self.n > 0);
        self.n -= 1;
        Units { held: self.held.clone(), n: 1 }
    }
}

impl Drop for Units {
    fn drop(&mut self) {
        if let Some((caps, of)) = &self.held {
            caps.release(of, self.n);
        }
    }
}

/// Checks one registration's options against the declared resources.
pub(crate) fn check(
    name: &str,
    options: &HandlerOptions,
    resources: &HashMap<String, usize>,
) -> Result<(), Error> {
    let bad = |m: String| Err(Error::InvalidArgument(m));
    if let Some(r) = &options.resource {
        if !resources.contains_key(r) {
            // Loudly: a typo would otherwise read as no limit at all.
            let mut known: Vec<&str> = resources.keys().map(String::as_str).collect();
            known.sort();
            let known = if known.is_empty() { "none".to_owned() } else { known.join(", ") };
            return bad(format!(
                "handler {name:?} names resource {r:?}, which WorkerBuilder::resource did not declare (declared: {known})"
            ));
        }
    }
    if options.max_running == Some(0) {
        return bad(format!("max_running of handler {name:?} must be at least 1"));
    }
    Ok(())
}
