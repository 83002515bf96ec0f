//! The claim plan: which handler names draw together, how many tasks each
//! call takes, and what each draw may take of the worker's capacities.
//!
//! Handlers without limits or batches share one draw, where a task is a
//! call (the usual case: one claim statement per turn, as before). A
//! handler that limits itself (a resource, `max_running`) or takes batches
//! counts differently, so it draws alone. Draws are served in a rotating
//! order, so that the first cannot take every free slot turn after turn,
//! and each sizes itself by what the earlier ones took.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use waymark_store::{ClaimRequest, Error, FleetLimit, PgExecutor, Store, Task};

use crate::limits::{Capacities, Units};
use crate::one_or_many::OneOrMany;

/// One draw's names, its tasks per call, and the capacities it spends;
/// its queues when it draws from some of the worker's only, and the fleet
/// limit it claims under, if any.
#[derive(Debug)]
pub(crate) struct Source {
    pub(crate) names: Vec<String>,
    pub(crate) batch: usize,
    pub(crate) limits: Arc<[usize]>,
    pub(crate) queues: Option<Vec<String>>,
    pub(crate) fleet: Option<FleetLimit>,
}

impl Source {
    /// Handlers without limits or batches: a call of theirs holds no unit,
    /// no fleet slot and no batch while it waits, so it may be claimed
    /// ahead of a free slot.
    fn is_plain(&self) -> bool {
        self.limits.is_empty() && self.fleet.is_none() && self.batch == 1
    }

    pub(crate) fn new(names: Vec<String>, batch: usize, limits: Arc<[usize]>) -> Self {
        Source { names, batch, limits, queues: None, fleet: None }
    }
}

/// A handler call the plan drew: its tasks (one, or a batch of one name)
/// and the units it holds until it ends.
#[derive(Debug)]
pub(crate) struct Call {
    /// Shared from here on: the run, its context and its settlement hold
    /// the one copy.
    pub(crate) tasks: OneOrMany<Arc<Task>>,
    pub(crate) units: Units,
    /// Drawn ahead of a free slot.
    pub(crate) ahead: bool,
}

/// What one turn drew, and the failure that cut it short, if one did (what
/// was drawn before it is ours and runs).
#[derive(Debug, Default)]
pub(crate) struct Drawn {
    pub(crate) calls: Vec<Call>,
    pub(crate) error: Option<Error>,
    /// Whether a claim statement probed (none may have run: every draw's
    /// capacity taken).
    pub(crate) probed: bool,
    /// Whether a claim statement got as many rows as it asked for: more
    /// may be due.
    pub(crate) full: bool,
}

#[derive(Debug)]
pub(crate) struct Planner {
    sources: Vec<Source>,
    caps: Arc<Capacities>,
    base: ClaimRequest,
    cursor: AtomicUsize,
}

impl Planner {
    pub(crate) fn new(sources: Vec<Source>, caps: Arc<Capacities>, base: ClaimRequest) -> Self {
        Planner { sources, caps, base, cursor: AtomicUsize::new(0) }
    }

    /// Whether any draw is bounded by a capacity, a fleet limit or its
    /// batches (a call that ends is then a reason to claim again: it freed
    /// a unit, a slot of the fleet's, or a slot that only such a draw,
    /// which never claims ahead, can take).
    pub(crate) fn limited(&self) -> bool {
        self.sources.iter().any(|s| !s.is_plain())
    }

    /// Whether any draw may claim calls ahead of a free slot (see
    /// [`Planner::draw`]): one of handlers without limits or batches. A
    /// worker without one must count no room ahead, or every claim would
    /// come back short of what it asked for and the loop would wait for a
    /// signal with work still due.
    pub(crate) fn claims_ahead(&self) -> bool {
        self.sources.iter().any(Source::is_plain)
    }

    /// Draws up to `free` calls, and up to `ahead` more for calls claimed
    /// ahead of a free slot: those only from the draw of handlers without
    /// limits or batches (a call claimed ahead must hold no unit, no fleet
    /// slot and no batch while it waits). Only the first draw probes (and
    /// so recovers expired leases) when `probe` is set. The draws run one
    /// after another (each sized by what the earlier took), and the calls
    /// start once all have answered: a claim statement takes milliseconds
    /// against leases of seconds, and the store bounds each one.
    pub(crate) async fn draw<E: PgExecutor>(
        &self,
        store: &Store<E>,
        free: usize,
        ahead: usize,
        probe: bool,
    ) -> Drawn {
        // At most a call per slot asked for, sized once (up to a bound).
        let mut drawn =
            Drawn { calls: Vec::with_capacity(free.saturating_add(ahead).min(4096)), ..Drawn::default() };
        let n = self.sources.len();
        let start = self.cursor.fetch_add(1, Ordering::Relaxed) % n.max(1);
        let (mut left, mut left_ahead) = (free, ahead);
        let mut probe = probe;
        for k in 0..n {
            let src = &self.sources[(start + k) % n];
            let plain = src.is_plain();
            let left_here = if plain { left + left_ahead } else { left };
            if left_here == 0 {
                continue;
            }
            // Reserved before the claim, so two claims in flight cannot
            // both count the same free unit.
            let mut units = self.caps.reserve(&src.limits, left_here);
            if units.count() == 0 {
                continue;
            }
            let limit = i64::try_from(units.count().saturating_mul(src.batch)).unwrap_or(i64::MAX);
            let mut req = self.base.clone().names(src.names.iter().cloned()).limit(limit).probe(probe);
            if let Some(queues) = &src.queues {
                req.queues.clone_from(queues);
            }
            req.fleet_limit.clone_from(&src.fleet);
            drawn.probed |= probe;
            probe = false;
            match store.claim(&req).await {
                Ok(tasks) => {
                    drawn.full |= i64::try_from(tasks.len()).unwrap_or(i64::MAX) >= limit;
                    let mut tasks = tasks.into_iter().peekable();
                    while tasks.peek().is_some() {
                        let call: OneOrMany<Arc<Task>> =
                            tasks.by_ref().take(src.batch).map(Arc::new).collect();
                        let ahead = left == 0;
                        drawn.calls.push(Call { tasks: call, units: units.take_one(), ahead });
                        if ahead {
                            left_ahead -= 1;
                        } else {
                            left -= 1;
                        }
                    }
                    // Units not drawn go back as `units` drops.
                }
                Err(e) => {
                    drawn.error = Some(e);
                    break;
                }
            }
        }
        drawn
    }
}
