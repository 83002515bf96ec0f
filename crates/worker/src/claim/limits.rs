//! Named resources and per-handler limits: how many calls may hold each at
//! once on this worker. A claim reserves its units before it draws, so the
//! worker never claims a task it could not start, and a call gives its unit
//! back when it ends (settled or given back), however it ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use waymark_store::Error;

use crate::shared::HandlerOptions;

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
