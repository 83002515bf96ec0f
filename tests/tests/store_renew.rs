//! `Store::renew_leases` on a real PostgreSQL: rows held by another
//! transaction are skipped, waited for within a bound, and kept. It needs a
//! second connection for the transaction that holds a row, so it runs on the
//! built-in pool rather than in the executor kit (whose executors may have
//! one connection).

use std::time::Duration;

use serde_json::json;
use waymark_pool::{PgPool, PoolTransaction};
use waymark_store::worker_protocol::WorkerProtocol;
use waymark_store::{Beat, ClaimRequest, Lease, NewTask, PgExecutor, PgTransaction, Store, TaskStatus};
use waymark_tests::{pool_store, TestSchema};

fn ids_of(beats: &[Beat]) -> Vec<String> {
    beats.iter().map(|b| b.id.clone()).collect()
}

/// Three tasks claimed by `w1`, sorted by id; the last has a cancel request.
async fn three_claimed(store: &Store<PgPool>) -> Vec<String> {
    for _ in 0..3 {
        store.submit(NewTask::new("x", json!({}))).await.expect("submit");
    }
    let claim = ClaimRequest::new("w1", ["default"]).limit(3).lease(Duration::from_secs(60));
    let mut ids: Vec<String> = store.claim(&claim).await.expect("claim").into_iter().map(|t| t.id).collect();
    ids.sort();
    store.cancel(&ids[2]).await.expect("cancel");
    ids
}

/// `worker`'s leases of `ids`.
fn leases(ids: &[String], worker: &str) -> Vec<Lease> {
    ids.iter().map(|id| Lease::new(id, worker)).collect()
}

/// Holds `id`'s row in a transaction that has settled it with `result` but
/// not committed: the row stays locked until the transaction ends.
async fn settling(store: &Store<PgPool>, id: &str, result: serde_json::Value) -> PoolTransaction {
    let mut tx = store.executor().begin().await.expect("begin");
    store.complete_in(&mut tx, &Lease::new(id, "w1"), result).await.expect("complete, uncommitted");
    tx
}

/// A row held past the wait is reported held, not lost, and left as it
/// was; the rest are renewed in the order asked; once free, it renews.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_held_past_the_wait_is_kept_not_lost() {
    let schema = TestSchema::new().await;
    let store = pool_store(&schema).await;
    let ids = three_claimed(&store).await;
    let (lease, wait) = (Duration::from_secs(90), Duration::from_millis(50));
    let tx = settling(&store, &ids[1], json!(null)).await;

    let mut asked = ids.clone();
    asked.insert(0, "task_not_mine".to_owned());
    let renewal = store.renew_leases(&leases(&asked, "w1"), lease, wait).await.expect("renew");
    assert_eq!(ids_of(&renewal.renewed), [ids[0].clone(), ids[2].clone()], "renewed, in the order asked");
    assert_eq!(ids_of(&renewal.held), [ids[1].clone()], "held by the open transaction");
    assert!(renewal.renewed[1].cancel_requested_at_ms.is_some(), "a cancel request is shown");
    for id in [&ids[0], &ids[2]] {
        let t = store.fetch(id).await.expect("get");
        assert!(t.lease_until_ms.expect("lease") >= t.updated_at_ms + 90_000, "renewed for 90 s");
    }

    tx.rollback().await.expect("rollback");
    let held = store.fetch(&ids[1]).await.expect("get");
    assert_eq!((held.status, held.worker_id.as_deref()), (TaskStatus::Running, Some("w1")), "still w1's");
    assert!(held.lease_until_ms.expect("lease") < held.updated_at_ms + 90_000, "not renewed while held");
    let renewal = store.renew_leases(&leases(&ids, "w1"), lease, wait).await.expect("renew");
    assert_eq!((ids_of(&renewal.renewed), renewal.held.len()), (ids.clone(), 0), "free again: renewed");
    let t = store.fetch(&ids[1]).await.expect("get");
    assert!(t.lease_until_ms.expect("lease") >= t.updated_at_ms + 90_000);

    let other = store.renew_leases(&leases(&ids, "w2"), lease, wait).await.expect("renew");
    assert!(other.renewed.is_empty() && other.held.is_empty(), "another worker owns none of them");
    assert_eq!(store.renew_leases(&leases(&[], "w1"), lease, wait).await.expect("empty"), Default::default());
    schema.drop().await;
}

/// A row whose holder commits while the renewal waits for it: a
/// settlement lands, so the task is lost to the renewal (in neither list),
/// and the renewal waited for the commit rather than giving up at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_settled_while_its_renewal_waits_is_reported_lost() {
    let schema = TestSchema::new().await;
    let store = std::sync::Arc::new(pool_store(&schema).await);
    let ids = three_claimed(&store).await;
    let tx = settling(&store, &ids[1], json!("done")).await;
    // The renewal starts while the row is held and waits up to 30 s for it;
    // the settlement commits once the renewal is seen waiting on the lock.
    let s = store.clone();
    let asked = ids.clone();
    let renewing = tokio::spawn(async move {
        s.renew_leases(&leases(&asked, "w1"), Duration::from_secs(60), Duration::from_secs(30)).await
    });
    let holder: i32 = tx.client().query_one("select pg_backend_pid()", &[]).await.expect("pid").get(0);
    let admin = waymark_tests::db::admin_client(&schema.url).await;
    waymark_tests::eventually(Duration::from_secs(10), "the renewal to wait on the row's lock", || async {
        let q = "select count(*) from pg_stat_activity where $1 = any(pg_blocking_pids(pid))";
        admin.query_one(q, &[&holder]).await.expect("activity").get::<_, i64>(0) > 0
    })
    .await;
    tx.commit().await.expect("commit the settlement");
    let renewal = renewing.await.expect("join").expect("renew");
    assert_eq!(ids_of(&renewal.renewed), [ids[0].clone(), ids[2].clone()]);
    assert!(renewal.held.is_empty(), "the wait ended with the commit: {:?}", renewal.held);
    assert_eq!(store.fetch(&ids[1]).await.expect("get").status, TaskStatus::Succeeded);
    schema.drop().await;
}

/// Two held rows: the first (in the order asked) stays locked for longer
/// than the whole wait, the second for a moment. The first cannot spend
/// the second's share: the second is renewed, the first reported held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_locked_for_long_does_not_cost_another_held_row_its_renewal() {
    let schema = TestSchema::new().await;
    let store = std::sync::Arc::new(pool_store(&schema).await);
    let ids = three_claimed(&store).await;
    let long = settling(&store, &ids[0], json!(null)).await;
    let brief = settling(&store, &ids[1], json!(null)).await;
    // Real time is what is under test: a lock that lasts 1 s, past the
    // first pass (100 ms a row) and inside the first row's share of the
    // second (about 2 s of a 4 s wait), so the second row is renewed in
    // the second pass, after the first row has had its share.
    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        brief.rollback().await.expect("release the second");
    });
    let started = std::time::Instant::now();
    let renewal = store
        .renew_leases(&leases(&ids, "w1"), Duration::from_secs(60), Duration::from_secs(4))
        .await
        .expect("renew");
    let took = started.elapsed();
    release.await.expect("join");
    assert!(took >= Duration::from_millis(1500), "the second row waited behind the first's share: {took:?}");
    assert_eq!(ids_of(&renewal.renewed), [ids[1].clone(), ids[2].clone()], "the briefly held row renewed");
    assert_eq!(ids_of(&renewal.held), [ids[0].clone()], "the row locked for long held");
    long.rollback().await.expect("release the first");
    schema.drop().await;
}

/// Many rows held by one short transaction (as the worker's own settlement
/// batch holds its rows until it commits) are renewed together once it
/// ends: a transaction per row could not fit 500 rows in the 150 ms the
/// renewal is given.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_rows_held_by_one_short_transaction_are_renewed_together() {
    let schema = TestSchema::new().await;
    let store = pool_store(&schema).await;
    let tasks: Vec<NewTask> = (0..500).map(|_| NewTask::new("x", json!({}))).collect();
    store.submit_batch(tasks).await.expect("submit");
    let claim = ClaimRequest::new("w1", ["default"]).limit(500).lease(Duration::from_secs(60));
    let mut ids: Vec<String> = store.claim(&claim).await.expect("claim").into_iter().map(|t| t.id).collect();
    ids.sort();
    assert_eq!(ids.len(), 500);
    // The holder locks every row, then, on the server, ends its transaction
    // as soon as another session waits for it: the release comes within a
    // millisecond or two of the renewal's first wait, well inside its
    // 100 ms, with nothing of the test's to schedule in between.
    let table = format!("\"{}\".cairnq_tasks", schema.schema);
    let holder = waymark_tests::db::admin_client(&schema.url).await;
    let (locked_tx, locked) = tokio::sync::oneshot::channel();
    let held = ids.clone();
    let hold = tokio::spawn(async move {
        holder.batch_execute("begin").await.expect("begin");
        let lock = format!("select 1 from {table} where id = any($1) for update");
        assert_eq!(holder.execute(&lock, &[&held]).await.expect("hold every row"), 500);
        locked_tx.send(()).expect("tell the test");
        holder
            .batch_execute(
                "do $$ begin
                     while not exists (
                         select 1 from pg_locks
                          where locktype = 'transactionid' and not granted
                            and transactionid::text = (txid_current() % 4294967296)::text
                     ) loop
                         perform pg_sleep(0.001);
                     end loop;
                 end $$;
                 rollback",
            )
            .await
            .expect("release once waited for");
    });
    locked.await.expect("rows held");
    let renewal = store
        .renew_leases(&leases(&ids, "w1"), Duration::from_secs(90), Duration::from_millis(150))
        .await
        .expect("renew");
    hold.await.expect("join");
    assert!(renewal.held.is_empty(), "{} rows still held", renewal.held.len());
    assert_eq!(ids_of(&renewal.renewed), ids, "every row renewed, in the order asked");
    schema.drop().await;
}
