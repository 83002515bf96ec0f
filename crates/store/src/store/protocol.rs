//! [`WorkerProtocol`] for every store: each operation names its body, which
//! lives with its concern (`claim.rs`, `renew.rs`, `settle.rs`).

use std::future::Future;
use std::time::Duration;

use serde_json::Value as Json;

use super::{claim, renew, settle, steps, Store};
use crate::error::Result;
use crate::executor::PgExecutor;
use crate::lease::Lease;
use crate::options::{ClaimRequest, Failure};
use crate::steps::{EventWait, StepHistory, StepKind, StepRecord};
use crate::task::{Beat, Renewal, Settled, Task};
use crate::worker_protocol::{Settlement, WorkerProtocol};

impl<E: PgExecutor> WorkerProtocol for Store<E> {
    type Executor = E;

    fn claim(&self, req: &ClaimRequest) -> impl Future<Output = Result<Vec<Task>>> + Send {
        claim::claim(self, req)
    }

    fn heartbeat(&self, lease: &Lease, length: Duration) -> impl Future<Output = Result<Task>> + Send {
        renew::heartbeat(self, lease, length)
    }

    fn heartbeat_batch(
        &self,
        ids: &[String],
        worker_id: &str,
        length: Duration,
    ) -> impl Future<Output = Result<Vec<Beat>>> + Send {
        renew::heartbeat_batch(self, ids, worker_id, length)
    }

    fn renew_leases(
        &self,
        leases: &[Lease],
        length: Duration,
        wait: Duration,
    ) -> impl Future<Output = Result<Renewal>> + Send {
        renew::renew_leases(self, leases, length, wait)
    }

    fn progress(
        &self,
        lease: &Lease,
        progress: Option<f64>,
        message: Option<&str>,
    ) -> impl Future<Output = Result<Task>> + Send {
        claim::progress(self, lease, progress, message)
    }

    fn complete(&self, lease: &Lease, result: Json) -> impl Future<Output = Result<Task>> + Send {
        settle::complete(self, lease, result)
    }

    fn complete_in(
        &self,
        tx: &mut E::Transaction,
        lease: &Lease,
        result: Json,
    ) -> impl Future<Output = Result<Task>> + Send {
        settle::complete_in(self, tx, lease, result)
    }

    fn succeed(
        &self,
        lease: &Lease,
        result: Json,
        message: Option<&str>,
    ) -> impl Future<Output = Result<Task>> + Send {
        settle::succeed(self, lease, result, message)
    }

    fn fail(&self, lease: &Lease, failure: &Failure) -> impl Future<Output = Result<Task>> + Send {
        settle::fail(self, lease, failure)
    }

    fn release(&self, lease: &Lease) -> impl Future<Output = Result<Task>> + Send {
        settle::release(self, lease)
    }

    fn snooze(&self, lease: &Lease, delay: Duration) -> impl Future<Output = Result<Task>> + Send {
        settle::snooze(self, lease, delay)
    }

    fn settle(&self, settlement: &Settlement) -> impl Future<Output = Result<Task>> + Send {
        settle::settle(self, settlement)
    }

    fn settle_batch(
        &self,
        items: &[Settlement],
    ) -> impl Future<Output = Result<Vec<Result<Settled>>>> + Send {
        settle::settle_batch(self, items)
    }

    fn steps(&self, task_id: &str) -> impl Future<Output = Result<StepHistory>> + Send {
        steps::steps(self, task_id)
    }

    fn record_step(
        &self,
        lease: &Lease,
        seq: i32,
        name: &str,
        kind: StepKind,
        result: Option<Json>,
        sleep: Duration,
    ) -> impl Future<Output = Result<(StepRecord, i64)>> + Send {
        steps::record_step(self, lease, seq, name, kind, result, sleep)
    }

    fn wait_for_event(
        &self,
        lease: &Lease,
        seq: i32,
        event: &str,
        timeout: Duration,
    ) -> impl Future<Output = Result<EventWait>> + Send {
        steps::wait_for_event(self, lease, seq, event, timeout)
    }

    fn record_step_in(
        &self,
        tx: &mut E::Transaction,
        lease: &Lease,
        seq: i32,
        name: &str,
        result: Json,
    ) -> impl Future<Output = Result<(StepRecord, i64)>> + Send {
        steps::record_step_in(self, tx, lease, seq, name, result)
    }
}
