//! Backpressure at the submit: waiting for room in a queue at its depth
//! limit, through the store's gate (`crate::backpressure`), which reads the
//! room left with `queue_depth`.

use std::time::Instant;

use super::Store;
use crate::backpressure::{Backpressure, Gate};
use crate::error::Result;
use crate::executor::PgExecutor;
use crate::new_task::{Conflict, NewTask};
use crate::task::TaskStatus;

impl<E: PgExecutor> Store<E> {
    /// The depth limits in force ([`ConnectOptions::backpressure`]), if any.
    ///
    /// [`ConnectOptions::backpressure`]: crate::ConnectOptions::backpressure
    pub fn backpressure(&self) -> Option<&Backpressure> {
        self.gate.as_deref().map(Gate::config)
    }

    /// Waits for room for one task, when its queue is limited. A keyed
    /// submit that will hand back the task its key names inserts nothing
    /// and waits for nothing. (The key is read without its lock: a race
    /// with another submit of the key makes this wait when it need not, or
    /// not when it should, within the gate's softness.)
    pub(super) async fn admit_one(&self, task: &NewTask) -> Result<()> {
        let Some(gate) = self.gate.as_deref().filter(|g| g.limits(&task.queue)) else {
            return Ok(());
        };
        if let Some(key) = &task.key {
            if let Some(state) = self.get_status_by_key(key).await? {
                if hands_back(task.conflict, state.status) {
                    return Ok(());
                }
            }
        }
        let queue = task.queue.as_str();
        gate.admit(queue, 1, Instant::now(), |limit| self.queue_depth(queue, limit)).await
    }

    /// Waits for room for a batch, queue by queue (in name order), within
    /// one maximum wait for the whole batch.
    pub(super) async fn admit_batch<'q>(&self, queues: impl IntoIterator<Item = &'q str>) -> Result<()> {
        let Some(gate) = self.gate.as_deref() else { return Ok(()) };
        let mut counts = std::collections::BTreeMap::<&str, i64>::new();
        for queue in queues {
            *counts.entry(queue).or_default() += 1;
        }
        let started = Instant::now();
        for (queue, n) in counts {
            gate.admit(queue, n, started, |limit| self.queue_depth(queue, limit)).await?;
        }
        Ok(())
    }
}

/// Whether a keyed submit with `conflict` hands back (or refuses on) the
/// task in `status` its key names, inserting nothing.
fn hands_back(conflict: Conflict, status: TaskStatus) -> bool {
    match conflict {
        Conflict::Reject => true,
        Conflict::Reuse => !status.is_terminal(),
        Conflict::ReuseSucceeded => !status.is_terminal() || status == TaskStatus::Succeeded,
        Conflict::Replace => false,
    }
}
