//! Held tasks through the store: a key's order, dependencies, events, an
//! operator's hand, the ledger's upkeep, and bad input refused with
//! nothing written. Claims and settlements are made by hand here, so each
//! step is one the test can see; `held_worker.rs` runs them on a worker.

use serde_json::{json, Value as Json};
use waymark_pool::PgPool;
use waymark_store::worker_protocol::WorkerProtocol;
use waymark_store::{
    claim_id, ClaimRequest, Failure, Flow, Held, HeldFilter, HeldState, NewTask, OnDeadline, PgExecutor,
    Store, Task, TaskStatus,
};
use waymark_tests::{pool_store, TestSchema};

fn task(name: &str) -> NewTask {
    NewTask::new(name, json!({})).queue("held").max_attempts(1)
}

/// Claims what is due in the test's queue, by id.
async fn claim(store: &Store<PgPool>) -> Vec<Task> {
    let request = ClaimRequest::new(claim_id("held-test"), ["held"]).limit(100);
    let mut tasks = store.claim(&request).await.expect("claim");
    tasks.sort_by(|a, b| a.id.cmp(&b.id));
    tasks
}

async fn succeed(store: &Store<PgPool>, t: &Task) {
    store.complete(&t.lease().expect("lease"), json!({"ok": true})).await.expect("complete");
}

async fn fail_for_good(store: &Store<PgPool>, t: &Task) {
    let failure = Failure {
        error: json!({"type": "Test", "code": "task_error"}),
        retryable: false,
        delay: Default::default(),
    };
    store.fail(&t.lease().expect("lease"), &failure).await.expect("fail");
}

async fn state(store: &Store<PgPool>, id: &str) -> (HeldState, Option<String>) {
    let row = store.held(id).await.expect("held").unwrap_or_else(|| panic!("no ledger row for {id}"));
    (row.state, row.outcome)
}

#[tokio::test]
async fn a_key_runs_one_task_at_a_time_in_order_and_a_failed_head_holds_only_its_key() {
    let schema = TestSchema::new().await;
    let store = pool_store(&schema).await;
    let a: Vec<_> = (0..3).map(|i| task(&format!("a{i}")).ordered_by("account:a")).collect();
    let b: Vec<_> = (0..2).map(|i| task(&format!("b{i}")).ordered_by("account:b")).collect();
    for held in a.iter().chain(&b) {
        store.hold(held.clone()).await.expect("hold");
    }
    // Each key's head only.
    let first = claim(&store).await;
    let names: Vec<&str> = first.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(names.contains(&"a0") && names.contains(&"b0"), "{names:?}");
    assert!(store.get(a[1].id()).await.expect("get").is_none(), "a held task is not in cairnq_tasks");

    // a0 fails for good: key a holds; b goes on.
    let a0 = first.iter().find(|t| t.name == "a0").unwrap();
    let b0 = first.iter().find(|t| t.name == "b0").unwrap();
    fail_for_good(&store, a0).await;
    succeed(&store, b0).await;
    let next = claim(&store).await;
    assert_eq!(next.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), vec!["b1"]);
    assert_eq!(state(&store, a[0].id()).await, (HeldState::Done, Some("failed".into())));
    let waiting = store.held(a[1].id()).await.unwrap().unwrap();
    assert_eq!(waiting.waiting_for(), vec!["its turn in key account:a".to_owned()]);

    // The operator skips the failed head: the key goes on, in order.
    assert_eq!(store.skip_held(a[0].id()).await.expect("skip"), HeldState::Done);
    let resumed = claim(&store).await;
    assert_eq!(resumed.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), vec!["a1"]);
    succeed(&store, &resumed[0]).await;
    assert_eq!(claim(&store).await.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), vec!["a2"]);
    schema.drop().await;
}

#[tokio::test]
async fn a_retried_head_that_succeeds_lets_its_key_go_on() {
    let schema = TestSchema::new().await;
    let store = pool_store(&schema).await;
    let first = task("first").ordered_by("k");
    let second = task("second").ordered_by("k");
    store.submit_flow(&flow_of([first.clone(), second.clone()])).await.expect("flow");
    let head = claim(&store).await.remove(0);
    fail_for_good(&store, &head).await;
    assert!(claim(&store).await.is_empty(), "the key is held by its failed head");
    store.retry(first.id(), true).await.expect("retry").expect("retried");
    let again = claim(&store).await.remove(0);
    assert_eq!(again.id, first.id());
    succeed(&store, &again).await;
    assert_eq!(claim(&store).await[0].id, second.id());
    schema.drop().await;
}

fn flow_of(tasks: impl IntoIterator<Item = Held>) -> Flow {
    let mut flow = Flow::new();
    for t in tasks {
        flow.add(t);
    }
    flow
}

#[tokio::test]
async fn a_graph_releases_each_task_after_all_it_depends_on_and_a_failure_cancels_what_follows() {
    let schema = TestSchema::new().await;
    let store = pool_store(&schema).await;
    let mut flow = Flow::new();
    let charge = flow.add(task("charge"));
    let ship = flow.add(task("ship").after([&charge]));
    let invoice = flow.add(task("invoice").after([&charge]));
    let email = flow.add(task("email").after([&ship, &invoice]));
    let receipts = store.submit_flow(&flow).await.expect("flow");
    let released: Vec<bool> = receipts.iter().map(|r| r.released).collect();
    assert_eq!(released, vec![true, false, false, false]);

    let step = claim(&store).await;
    assert_eq!(step.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(), vec![charge.as_str()]);
    succeed(&store, &step[0]).await;
    let step = claim(&store).await;
    let mut names: Vec<&str> = step.iter().map(|t| t.name.as_str()).collect();
    names.sort();
    assert_eq!(names, vec!["invoice", "ship"]);
    let by_name = |n: &str| step.iter().find(|t| t.name == n).unwrap().clone();
    succeed(&store, &by_name("ship")).await;
    assert!(claim(&store).await.is_empty(), "email waits for invoice too");
    assert_eq!(store.held(&email).await.unwrap().unwrap().waiting_on, vec![invoice.clone()]);
    succeed(&store, &by_name("invoice")).await;
    assert_eq!(claim(&store).await[0].id, email);

    // A second flow whose first task fails: everything behind it is canceled.
    let mut flow = Flow::new();
    let root = flow.add(task("root"));
    let mid = flow.add(task("mid").after([&root]));
    let leaf = flow.add(task("leaf").after([&mid]));
    store.submit_flow(&flow).await.expect("flow");
    fail_for_good(&store, &claim(&store).await[0]).await;
    assert_eq!(state(&store, &mid).await, (HeldState::Canceled, Some("dependency".into())));
    assert_eq!(state(&store, &leaf).await, (HeldState::Canceled, Some("dependency".into())));
    assert!(claim(&store).await.is_empty());
    let filter = HeldFilter { state: None, flow_id: Some(flow.id().into()), ..Default::default() };
    assert_eq!(store.list_held(&filter).await.expect("list").len(), 3);
    schema.drop().await;
}

#[tokio::test]
async fn a_release_commits_with_the_settlement_that_allows_it_or_not_at_all() {
    let schema = TestSchema::new().await;
    let store = pool_store(&schema).await;
    let mut flow = Flow::new();
    let first = flow.add(task("first"));
    let then = flow.add(task("then").after([&first]));
    store.submit_flow(&flow).await.expect("flow");
    let claimed = claim(&store).await.remove(0);
    let lease = claimed.lease().expect("lease");
    assert!(lease.is_from_held(), "a released task's lease says so");

    // Settled in a transaction that rolls back: nothing moved.
    let mut tx = store.executor().begin().await.expect("begin");
    store.complete_in(&mut tx, &lease, json!(1)).await.expect("complete_in");
    assert!(store.get(&then).await.expect("get").is_none(), "not visible before the commit");
    waymark_store::PgTransaction::rollback(tx).await.expect("rollback");
    assert_eq!(store.fetch(&first).await.expect("fetch").status, TaskStatus::Running);
    assert_eq!(state(&store, &then).await.0, HeldState::Held);

    // Committed: the dependent is queued by the same commit.
    let mut tx = store.executor().begin().await.expect("begin");
    store.complete_in(&mut tx, &lease, json!(1)).await.expect("complete_in");
    waymark_store::PgTransaction::commit(tx).await.expect("commit");
    assert_eq!(store.fetch(&then).await.expect("fetch").status, TaskStatus::Queued);
    assert_eq!(state(&store, &first).await, (HeldState::Done, Some("succeeded".into())));
    schema.drop().await;
}

#[tokio::test]
async fn an_end_no_waymark_settlement_passed_on_is_passed_on_by_the_sweep() {
    let schema = TestSchema::new().await;
    let store = pool_store(&schema).await;
    // A plain task, settled by plain SQL as another SDK would, and a held
    // task that depends on it.
    let plain = store.submit(task("plain")).await.expect("submit");
    let after = store.hold(task("after").after([plain.id.clone()])).await.expect("hold");
    assert!(!after.released);
    let settled_elsewhere = format!(
        "update cairnq_tasks set status = 'succeeded', completed_at_ms = 1 where id = '{}'",
        plain.id
    );
    schema.execute(&settled_elsewhere).await;
    assert_eq!(state(&store, &after.id).await.0, HeldState::Held);
    let pass = store.sweep_held(100).await.expect("sweep");
    assert_eq!(pass.settled, 1, "{pass:?}");
    assert_eq!(store.fetch(&after.id).await.expect("fetch").status, TaskStatus::Queued);
    schema.drop().await;
}

#[tokio::test]
async fn an_event_releases_its_tasks_with_its_payload_and_one_emitted_earlier_is_kept() {
    let schema = TestSchema::new().await;
    let store = pool_store(&schema).await;
    let waiting = store.hold(task("on.paid").on_event("invoice.paid:42")).await.expect("hold");
    assert!(!waiting.released);
    assert_eq!(store.emit("invoice.paid:42", json!({"amount": 5})).await.expect("emit"), 1);
    let released = store.fetch(&waiting.id).await.expect("fetch");
    assert_eq!(
        released.metadata["waymark_event"],
        json!({"name": "invoice.paid:42", "payload": {"amount": 5}})
    );
    assert_eq!(released.metadata["waymark_held"], Json::Bool(true));

    // Emitted before anyone waits: a later hold goes at once.
    assert_eq!(store.emit("invoice.paid:43", json!("early")).await.expect("emit"), 0);
    let late = store.hold(task("on.paid").on_event("invoice.paid:43")).await.expect("hold");
    assert!(late.released);
    assert_eq!(store.fetch(&late.id).await.unwrap().metadata["waymark_event"]["payload"], json!("early"));
    schema.drop().await;
}

#[tokio::test]
async fn a_deadline_releases_or_cancels_by_its_policy() {
    let schema = TestSchema::new().await;
    let store = pool_store(&schema).await;
    let zero = std::time::Duration::ZERO;
    let goes = store.hold(task("goes").on_event("never").deadline(zero, OnDeadline::Release)).await.unwrap();
    let stops = task("stops").on_event("never").deadline(zero, OnDeadline::Cancel);
    let behind = task("behind").after([stops.id()]);
    store.submit_flow(&flow_of([stops.clone(), behind.clone()])).await.unwrap();
    let pass = store.sweep_held(100).await.expect("sweep");
    assert_eq!(pass.deadlines, 2, "{pass:?}");
    let went = store.fetch(&goes.id).await.expect("released");
    assert_eq!(went.metadata["waymark_event"], json!({"name": "never", "timed_out": true}));
    assert_eq!(state(&store, stops.id()).await, (HeldState::Canceled, Some("deadline".into())));
    assert_eq!(state(&store, behind.id()).await, (HeldState::Canceled, Some("dependency".into())));
    schema.drop().await;
}

#[tokio::test]
async fn an_operator_releases_or_drops_a_held_task_and_a_wrong_one_is_named() {
    let schema = TestSchema::new().await;
    let store = pool_store(&schema).await;
    let held = store.hold(task("waits").on_event("x")).await.unwrap();
    assert_eq!(store.release_held(&held.id).await.expect("release"), HeldState::Released);
    assert_eq!(store.fetch(&held.id).await.unwrap().status, TaskStatus::Queued);
    let again = store.release_held(&held.id).await.unwrap_err();
    assert!(matches!(again, waymark_store::Error::InvalidArgument(_)), "{again}");
    assert!(again.to_string().contains("released"), "{again}");
    let missing = store.drop_held("task_nope").await.unwrap_err();
    assert!(missing.is_not_found(), "{missing}");

    let dropped = task("dropped").ordered_by("d").on_event("never");
    let next = task("next").ordered_by("d");
    store.submit_flow(&flow_of([dropped.clone(), next.clone()])).await.unwrap();
    assert_eq!(store.drop_held(dropped.id()).await.expect("drop"), HeldState::Canceled);
    let claimed: Vec<String> = claim(&store).await.into_iter().map(|t| t.id).collect();
    assert!(claimed.contains(&next.id().to_owned()), "the key goes on past a dropped task: {claimed:?}");
    schema.drop().await;
}

#[tokio::test]
async fn bad_input_is_refused_with_its_name_and_nothing_written() {
    let schema = TestSchema::new().await;
    let store = pool_store(&schema).await;
    let failed = store.submit(task("failed")).await.unwrap();
    fail_for_good(&store, &claim(&store).await[0]).await;
    let before = (schema.count("cairnq_tasks").await, schema.count("waymark_held").await);

    let a = Held::from(task("a"));
    let b = task("b").after([a.id()]);
    let cases: Vec<(Vec<Held>, String)> = vec![
        (vec![a.clone().after([b.id()]), b.clone()], "cycle".into()),
        (vec![task("x").ordered_by("k"), task("y").after(["task_elsewhere"])], "task_elsewhere".into()),
        (vec![task("z").ordered_by("k"), task("w").after([failed.id.clone()])], "has ended failed".into()),
    ];
    for (tasks, expect) in cases {
        let err = store.submit_flow(&flow_of(tasks)).await.unwrap_err();
        assert!(matches!(err, waymark_store::Error::InvalidArgument(_)), "{err}");
        assert!(err.to_string().contains(&expect), "{err} should name {expect}");
    }
    let after = (schema.count("cairnq_tasks").await, schema.count("waymark_held").await);
    assert_eq!(before, after, "nothing written");
    assert_eq!(schema.count("waymark_order_keys").await, 0, "no key row left behind");
    schema.drop().await;
}

/// A submit to a key that commits while the key's head is being settled:
/// the settlement waits for the submit's key lock, then must see the new
/// task as the next in line (the head moves to it, and it is released).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submit_that_commits_during_its_keys_settlement_is_next_in_line() {
    let schema = TestSchema::new().await;
    let store = std::sync::Arc::new(pool_store(&schema).await);
    store.hold(task("head").ordered_by("k")).await.unwrap();
    let head = claim(&store).await.remove(0);
    let next = hold_while_settling(&schema, &store, task("next").ordered_by("k"), head, End::Success).await;
    assert_eq!(store.fetch(&next.id).await.expect("released").status, TaskStatus::Queued);
    schema.drop().await;
}

/// A task added after a dependent while the dependency fails: the
/// cancel's cascade waits for the submit, then reaches the new task too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cascade_reaches_a_dependent_added_while_it_waits() {
    let schema = TestSchema::new().await;
    let store = std::sync::Arc::new(pool_store(&schema).await);
    let first = Held::from(task("first"));
    let middle = task("middle").after([first.id()]);
    store.submit_flow(&flow_of([first.clone(), middle.clone()])).await.unwrap();
    let running = claim(&store).await.remove(0);
    let last =
        hold_while_settling(&schema, &store, task("last").after([middle.id()]), running, End::Failure).await;
    assert_eq!(state(&store, middle.id()).await.0, HeldState::Canceled);
    assert_eq!(state(&store, &last.id).await, (HeldState::Canceled, Some("dependency".into())));
    schema.drop().await;
}

/// Retention forgets ended ledger rows, but never a failed head that holds
/// its key: the operator must still be able to skip it.
#[tokio::test]
async fn retention_keeps_a_failed_head_that_holds_its_key() {
    let schema = TestSchema::new().await;
    let store = pool_store(&schema).await;
    let head = task("head").ordered_by("k");
    let behind = task("behind").ordered_by("k");
    store.submit_flow(&flow_of([head.clone(), behind.clone()])).await.unwrap();
    fail_for_good(&store, &claim(&store).await[0]).await;
    let done = store.hold(task("done")).await.unwrap();
    succeed(&store, &claim(&store).await[0]).await;
    let forgotten = store.purge_held(std::time::Duration::ZERO, 100).await.expect("purge");
    assert_eq!(forgotten, vec![done.id.clone()], "the ended row that holds nothing is forgotten");
    assert_eq!(store.skip_held(head.id()).await.expect("skip"), HeldState::Done);
    assert_eq!(claim(&store).await[0].id, behind.id());
    schema.drop().await;
}

#[tokio::test]
async fn out_of_range_times_and_nul_ids_are_refused_by_name() {
    let schema = TestSchema::new().await;
    let store = pool_store(&schema).await;
    let far = std::time::Duration::from_millis(i64::MAX as u64 - 1);
    let err = store.hold(task("a").on_event("e").deadline(far, OnDeadline::Cancel)).await.unwrap_err();
    assert!(
        matches!(err, waymark_store::Error::InvalidArgument(_)) && err.to_string().contains("deadline"),
        "{err}"
    );
    let err = store.emit_kept("e", json!(1), far).await.unwrap_err();
    assert!(
        matches!(err, waymark_store::Error::InvalidArgument(_)) && err.to_string().contains("keep"),
        "{err}"
    );
    let err = store.hold(task("a").after(["task_\0"])).await.unwrap_err();
    assert!(
        matches!(err, waymark_store::Error::InvalidArgument(_)) && err.to_string().contains("NUL"),
        "{err}"
    );
    assert_eq!(schema.count("waymark_held").await + schema.count("waymark_events").await, 0);
    schema.drop().await;
}

/// Sessions of the test's database waiting for a lock.
async fn lock_waits(schema: &TestSchema) -> i64 {
    let admin = waymark_tests::db::admin_client(&schema.url).await;
    let sql = "select count(*) from pg_stat_activity \
               where wait_event_type = 'Lock' and datname = current_database()";
    admin.query_one(sql, &[]).await.expect("lock waits").get(0)
}

/// A row written by hand into cairnq_tasks under a held task's id does not
/// stop the settlement that releases it: the release leaves that row be,
/// and the ledger follows its end.
#[tokio::test]
async fn a_release_into_an_id_taken_by_hand_leaves_the_row_and_settles() {
    let schema = TestSchema::new().await;
    let store = pool_store(&schema).await;
    let first = Held::from(task("first"));
    let then = task("then").after([first.id()]);
    store.submit_flow(&flow_of([first.clone(), then.clone()])).await.unwrap();
    schema
        .execute(&format!(
            "insert into cairnq_tasks (id, name, queue, status, payload, run_at_ms, root_id, created_at_ms, \
             updated_at_ms) values ('{}', 'by-hand', 'elsewhere', 'queued', '{{}}', 0, '{}', 0, 0)",
            then.id(),
            then.id()
        ))
        .await;
    let running = claim(&store).await.remove(0);
    succeed(&store, &running).await;
    assert_eq!(state(&store, then.id()).await.0, HeldState::Released);
    assert_eq!(store.fetch(then.id()).await.unwrap().name, "by-hand", "the row by hand is left as it was");
    schema.drop().await;
}

/// How the settlement in [`hold_while_settling`] ends its task.
enum End {
    Success,
    Failure,
}

/// Holds `held` in a transaction left open, settles `running` meanwhile,
/// waits until that settlement waits on the open transaction's locks, then
/// commits both in that order; answers the receipt.
async fn hold_while_settling(
    schema: &TestSchema,
    store: &std::sync::Arc<Store<PgPool>>,
    held: Held,
    running: Task,
    end: End,
) -> waymark_store::HeldReceipt {
    let mut tx = store.executor().begin().await.expect("begin");
    let receipt = store.hold_in(&mut tx, held).await.expect("hold_in");
    let settling = {
        let store = store.clone();
        tokio::spawn(async move {
            match end {
                End::Success => succeed(&store, &running).await,
                End::Failure => fail_for_good(&store, &running).await,
            }
        })
    };
    let waiting = || async { lock_waits(schema).await > 0 };
    waymark_tests::eventually(
        std::time::Duration::from_secs(10),
        "the settlement to wait on the submit",
        waiting,
    )
    .await;
    waymark_store::PgTransaction::commit(tx).await.expect("commit");
    settling.await.expect("settled");
    receipt
}
