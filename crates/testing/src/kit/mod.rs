//! The executor contract kit: the store's whole contract, as cases that run
//! against any [`PgExecutor`]. The author of an
//! adapter over their own pool runs the very cases waymark's executors pass:
//!
//! ```no_run
//! // tests/contract.rs of a crate with an executor of its own (here the
//! // built-in pool stands in for it):
//! use waymark_pool::PgPool;
//! use waymark_store::{ConnectOptions, Store};
//!
//! async fn make(schema: &waymark_testing::TestSchema) -> Store<PgPool> {
//!     let exec = PgPool::builder(&schema.url).schema(&schema.schema).build().expect("executor");
//!     Store::connect(exec, ConnectOptions::new().schema(&schema.schema)).await.expect("connect")
//! }
//!
//! waymark_testing::store_contract!(make);
//! # fn main() {}
//! ```
//!
//! `store_contract!(make)` expands to one `#[tokio::test]` per case, each on
//! a fresh [`TestSchema`](crate::TestSchema) (`DATABASE_URL`); with
//! `store_contract!(make, schema = T)`, on a `T` of the caller's that has
//! `T::new().await`, `t.drop().await`, and that `make` takes by reference.
//! The case list below is the one list: a unit test fails on a case
//! written in these files and missing from it.

use waymark_store::{ClaimRequest, ListFilter, PgExecutor, Store};

mod admin;
mod claim;
mod json_values;
mod settle;
mod submit;
mod twins;
mod unreadable;

pub use admin::*;
pub use claim::*;
pub use json_values::*;
pub use settle::*;
pub use submit::*;
pub use twins::*;
pub use unreadable::*;

/// Expands to one test per contract case for the executor `make` builds.
#[macro_export]
macro_rules! store_contract {
    ($make:path) => {
        $crate::store_contract!($make, schema = $crate::TestSchema);
    };
    ($make:path, schema = $schema:ty) => {
        $crate::store_contract!(@cases $make; $schema;
            submit_defaults_and_reads,
            bad_arguments_are_refused_with_a_clear_error,
            submit_in_commits_and_rolls_back_with_the_caller,
            cancel_in_commits_and_rolls_back_with_the_caller,
            cancel_by_key_in_commits_and_rolls_back_with_the_caller,
            retry_in_commits_and_rolls_back_with_the_caller,
            retry_by_key_in_commits_and_rolls_back_with_the_caller,
            purge_in_commits_and_rolls_back_with_the_caller,
            get_in_sees_the_callers_uncommitted_writes,
            complete_in_commits_with_the_callers_writes,
            keyed_submit_strategies,
            concurrent_keyed_submits_make_one_task,
            claim_order_shapes_and_due_time,
            expired_leases_are_recovered,
            a_claim_without_its_probe_claims_due_work_and_recovers_nothing,
            heartbeat_batch_reports_owned_tasks_in_order,
            lost_lease_writes_change_nothing,
            a_lease_is_fenced_to_its_claims_worker_id,
            fail_retries_after_the_delay,
            progress_keeps_what_is_not_given,
            queue_depth_and_stats,
            purge_takes_the_key_with_it,
            migrate_is_idempotent,
            settle_batch_answers_each_settlement_on_its_own,
            settle_batch_of_one_workers_completes_answers_each,
            release_gives_a_task_back_without_spending_its_attempt,
            snooze_requeues_later_keeping_attempt_and_error,
            submit_batch_inserts_many_in_order,
            submit_batch_of_alike_tasks_writes_what_they_share,
            a_row_it_cannot_read_stops_nothing,
            a_column_added_by_an_operator_is_never_read,
            an_attempt_out_of_range_stops_no_claim,
            every_json_value_is_kept_as_written,
        );
    };
    (@cases $make:path; $schema:ty; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let schema = <$schema>::new().await;
                let store = $make(&schema).await;
                $crate::kit::$case(&store).await;
                schema.drop().await;
            }
        )*
    };
}

pub(crate) fn claim(worker: &str) -> ClaimRequest {
    ClaimRequest::new(worker, ["default"]).lease(std::time::Duration::from_secs(30))
}

/// Ends the leases `worker` holds, as time would: the next claim pass that
/// probes finds them expired. Written to the row, so no test waits for a
/// lease to run out.
pub(crate) async fn expire_leases<E: PgExecutor>(store: &Store<E>, worker: &str) {
    raw(
        store,
        &format!(
            "update cairnq_tasks set lease_until_ms = 1 where status = 'running' and worker_id = '{worker}'"
        ),
    )
    .await;
}

/// Runs `sql` as a script, as another client would.
pub(crate) async fn raw<E: PgExecutor>(store: &Store<E>, sql: &str) {
    store.executor().execute_script(sql).await.expect(sql);
}

pub(crate) async fn count_all<E: PgExecutor>(store: &Store<E>) -> usize {
    store.list(&ListFilter { limit: 10_000, ..ListFilter::default() }).await.expect("list").len()
}

#[cfg(test)]
mod tests {
    /// Every case written in the kit's files is in the macro's list.
    #[test]
    fn every_case_is_listed() {
        let listed = include_str!("mod.rs");
        let files = [
            include_str!("admin.rs"),
            include_str!("claim.rs"),
            include_str!("json_values.rs"),
            include_str!("settle.rs"),
            include_str!("submit.rs"),
            include_str!("twins.rs"),
            include_str!("unreadable.rs"),
        ];
        let mut cases = 0;
        for file in files {
            for line in file.lines() {
                let Some(rest) = line.strip_prefix("pub async fn ") else { continue };
                let name = rest.split('<').next().unwrap_or(rest);
                cases += 1;
                assert!(
                    listed.contains(&format!("            {name},\n")),
                    "kit case {name} is written but not in store_contract!'s list"
                );
            }
        }
        assert!(cases >= 20, "found only {cases} cases");
    }
}
