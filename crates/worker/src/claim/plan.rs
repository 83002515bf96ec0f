//! The claim plan: which handler names draw together, how many tasks each
//! call takes, and what each draw may take of the worker's capacities.
//!
//! Handlers without limits or batches share one draw, where a task is a
//! call (the usual case: one claim statement per turn, as before). A
//! handler that limits itself (a resource, `max_running`) or takes batches
//! counts differently, so it draws alone. Draws are served in a rotating
//! order, so that the first cannot take every free slot turn after turn,
//! and each sizes itself by what the earlier ones took.
//!
//! A draw under a fleet limit that could not get its turn (another claimer
//! held the limit's lock past the store's bound) gives up that draw only:
//! the turn's other draws go on, and it sits out a short pause, doubling
//! while its turns keep being missed, before it tries again.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use waymark_store::worker_protocol::WorkerProtocol;
use waymark_store::{ClaimRequest, Error, FleetLimit, PgExecutor, Store, Task};

use super::limits::{Capacities, Units};
use crate::shared::OneOrMany;

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
    /// Under a fleet limit: its missed turns (see [`Turn`]).
    pub(crate) turn: Mutex<Turn>,
}

/// The first pause of a draw that missed its turn under a fleet limit; it
/// doubles up to [`TURN_PAUSE_MAX`] while its turns keep being missed.
/// Each try holds up the draws after it in its turn for the store's
/// bound on the wait (`FLEET_LIMIT_TURN_WAIT`), so the pause keeps a
/// stalled limit from slowing every turn, and bounds how long after the
/// stall the limit's claims resume.
const TURN_PAUSE_FIRST: Duration = Duration::from_millis(50);
const TURN_PAUSE_MAX: Duration = Duration::from_secs(1);

/// A draw's missed turns: when it may try again, and the pause after the
/// next miss.
#[derive(Debug, Default)]
pub(crate) struct Turn {
    retry_at: Option<Instant>,
    pause: Duration,
}

impl Source {
    /// Handlers without limits or batches: a call of theirs holds no unit,
    /// no fleet slot and no batch while it waits, so it may be claimed
    /// ahead of a free slot.
    fn is_plain(&self) -> bool {
        self.limits.is_empty() && self.fleet.is_none() && self.batch == 1
    }

    pub(crate) fn new(names: Vec<String>, batch: usize, limits: Arc<[usize]>) -> Self {
        Source { names, batch, limits, queues: None, fleet: None, turn: Mutex::default() }
    }

    /// When the draw may try for its turn again, if that is after `now`.
    fn sits_out(&self, now: Instant) -> Option<Instant> {
        self.fleet.as_ref()?;
        self.turn.lock().unwrap_or_else(|p| p.into_inner()).retry_at.filter(|at| *at > now)
    }

    /// Its turn was missed: when to try again.
    fn missed_turn(&self) -> Instant {
        let mut turn = self.turn.lock().unwrap_or_else(|p| p.into_inner());
        let was = turn.pause;
        turn.pause = (was * 2).clamp(TURN_PAUSE_FIRST, TURN_PAUSE_MAX);
        if turn.pause == TURN_PAUSE_MAX && was < TURN_PAUSE_MAX {
            tracing::warn!(
                limit = %self.fleet.as_ref().map(ToString::to_string).unwrap_or_default(),
                "claims under a fleet limit keep missing their turn (a claimer holds its lock); \
                 the worker's other draws go on, and these are tried again every {TURN_PAUSE_MAX:?}"
            );
        }
        let at = Instant::now() + turn.pause;
        turn.retry_at = Some(at);
        at
    }

    /// Its turn came: the next miss starts the pauses over.
    fn took_turn(&self) {
        if self.fleet.is_some() {
            *self.turn.lock().unwrap_or_else(|p| p.into_inner()) = Turn::default();
        }
    }
}

/// A handler call the plan drew: its tasks (one, or a batch of one name)
/// and the units it holds until it ends.
#[derive(Debug)]
pub(crate) struct DrawnCall {
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
    pub(crate) calls: Vec<DrawnCall>,
    pub(crate) error: Option<Error>,
    /// Whether a claim statement probed (none may have run: every draw's
    /// capacity taken).
    pub(crate) probed: bool,
    /// Whether a claim statement got as many rows as it asked for: more
    /// may be due.
    pub(crate) full: bool,
    /// When the first draw that missed its turn under a fleet limit (or
    /// sat this one out after missing one) tries again: a turn then may
    /// find work that this one could not look for.
    pub(crate) turn_at: Option<Instant>,
}

/// A claim task that panicked or was cancelled: what it claimed, if
/// anything, comes back when the leases expire.
pub(crate) fn claim_panicked(e: tokio::task::JoinError) -> Error {
    Error::Internal(format!(
        "the claim task ended abnormally ({e}); its claims, if any, return on lease expiry"
    ))
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
        let now = Instant::now();
        for k in 0..n {
            let src = &self.sources[(start + k) % n];
            let plain = src.is_plain();
            let left_here = if plain { left + left_ahead } else { left };
            if left_here == 0 {
                continue;
            }
            if let Some(at) = src.sits_out(now) {
                drawn.turn_at = Some(drawn.turn_at.map_or(at, |t| t.min(at)));
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
            // The claim's own worker id: every owned write of its tasks
            // names it, so a write resent after its answer was lost never
            // lands on a later claim of the same task by this worker (a
            // release gives the attempt back; the attempt alone could not
            // tell the two claims apart).
            req.worker_id = waymark_store::claim_id(&self.base.worker_id);
            if let Some(queues) = &src.queues {
                req.queues.clone_from(queues);
            }
            req.fleet_limit.clone_from(&src.fleet);
            let probing = probe;
            drawn.probed |= probe;
            probe = false;
            match store.claim(&req).await {
                Ok(tasks) => {
                    src.took_turn();
                    drawn.full |= i64::try_from(tasks.len()).unwrap_or(i64::MAX) >= limit;
                    let mut tasks = tasks.into_iter().peekable();
                    while tasks.peek().is_some() {
                        let call: OneOrMany<Arc<Task>> =
                            tasks.by_ref().take(src.batch).map(Arc::new).collect();
                        let ahead = left == 0;
                        drawn.calls.push(DrawnCall { tasks: call, units: units.take_one(), ahead });
                        if ahead {
                            left_ahead -= 1;
                        } else {
                            left -= 1;
                        }
                    }
                    // Units not drawn go back as `units` drops.
                }
                // Its turn did not come: this draw gives it up (its units
                // go back), not the others; a later draw probes instead.
                Err(e) if src.fleet.is_some() && e.is_lock_timeout() => {
                    tracing::debug!(error = %e, "a draw under a fleet limit missed its turn");
                    let at = src.missed_turn();
                    drawn.turn_at = Some(drawn.turn_at.map_or(at, |t| t.min(at)));
                    (probe, drawn.probed) = (probing, drawn.probed && !probing);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missed_turn_sits_out_a_pause_that_doubles_to_a_second_and_starts_over_once_taken() {
        let mut src = Source::new(vec!["n".into()], 1, Arc::from(Vec::new()));
        src.fleet = Some(FleetLimit::queue("q", 1));
        assert_eq!(src.sits_out(Instant::now()), None, "no turn missed yet");
        let pauses: Vec<u128> = (0..7)
            .map(|_| {
                let at = src.missed_turn();
                assert_eq!(src.sits_out(Instant::now()), Some(at), "it sits out until then");
                src.turn.lock().unwrap().pause.as_millis()
            })
            .collect();
        assert_eq!(pauses, [50, 100, 200, 400, 800, 1000, 1000]);
        assert_eq!(src.sits_out(Instant::now() + TURN_PAUSE_MAX), None, "and no longer");
        src.took_turn();
        assert_eq!(src.sits_out(Instant::now()), None);
        src.missed_turn();
        assert_eq!(src.turn.lock().unwrap().pause, TURN_PAUSE_FIRST, "a taken turn starts the pauses over");
    }
}
