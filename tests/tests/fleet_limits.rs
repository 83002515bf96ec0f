//! Fleet-wide concurrency limits across worker processes on a real
//! PostgreSQL: four `fleet_worker` processes of 32 slots each drain a
//! backlog under a limit of 5, sampled every 10 ms, never more than 5
//! running, also after one of them is killed with its tasks running (their
//! slots free when their leases are recovered); a per-tenant limit likewise
//! holds for every tenant while tenants run side by side.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::json;
use waymark_store::worker_protocol::WorkerProtocol;
use waymark_store::NewTask;
use waymark_tests::db::admin_client;
use waymark_tests::{pool_store, TestSchema};

const WORKERS: usize = 4;

async fn start_fleet(schema: &TestSchema, limit: &str) -> Vec<tokio::process::Child> {
    let mut fleet = Vec::new();
    for _ in 0..WORKERS {
        let (child, _lines) = waymark_tests::child::start_ready(
            env!("CARGO_BIN_EXE_fleet_worker"),
            &[&schema.url, &schema.schema, limit],
        )
        .await;
        fleet.push(child);
    }
    fleet
}

async fn stop_fleet(fleet: Vec<tokio::process::Child>) {
    for mut child in fleet {
        if let Some(pid) = child.id() {
            let _ = std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status();
        }
        let _ = tokio::time::timeout(Duration::from_secs(30), child.wait()).await;
    }
}

/// Running tasks per tenant (all under `""` when tasks have none), sampled
/// every 10 ms until every task has succeeded; answers each tenant's most
/// seen at once and the most seen in all. Once `after_done` tasks have
/// succeeded, `during` is given the running tasks (id, worker id) at each
/// sample until it answers that it acted.
async fn sample_until_drained(
    schema: &TestSchema,
    total: i64,
    after_done: i64,
    mut during: impl FnMut(&[(String, String)]) -> bool,
) -> (BTreeMap<String, i64>, i64, usize) {
    let client = admin_client(&schema.url).await;
    let table = format!("{}.cairnq_tasks", schema.schema);
    let (mut per_tenant, mut most, mut samples) = (BTreeMap::<String, i64>::new(), 0i64, 0usize);
    let mut fired = false;
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    loop {
        tick.tick().await;
        let rows = client
            .query(
                &format!(
                    "select coalesce(payload->>'tenant', ''), count(*) from {table} \
                     where status = 'running' group by 1"
                ),
                &[],
            )
            .await
            .expect("sample");
        let mut now = 0;
        for row in rows {
            let (tenant, n): (String, i64) = (row.get(0), row.get(1));
            now += n;
            let seen = per_tenant.entry(tenant).or_default();
            *seen = (*seen).max(n);
        }
        most = most.max(now);
        samples += 1;
        let done: i64 = client
            .query_one(&format!("select count(*) from {table} where status = 'succeeded'"), &[])
            .await
            .expect("done")
            .get(0);
        if !fired && done >= after_done {
            let running: Vec<(String, String)> = client
                .query(&format!("select id, worker_id from {table} where status = 'running'"), &[])
                .await
                .expect("running tasks")
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect();
            fired = during(&running);
        }
        if done == total {
            return (per_tenant, most, samples);
        }
        assert!(Instant::now() < deadline, "drain not finished in 120 s: {done} of {total} succeeded");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_workers_never_run_more_than_the_limit_also_when_one_dies() {
    const TASKS: i64 = 300;
    let schema = TestSchema::new().await;
    let store = pool_store(&schema).await;
    // Claimed first, and its first run holds on until its worker dies: the
    // worker killed below is the one running it, so it surely dies with a
    // task running (one that ends on its own may be settled by then).
    let held =
        NewTask::new("fleet.work", json!({"n": -1, "ms": 0, "hold": true})).queue("fleet").priority(10);
    let held = store.submit(held).await.expect("submit the held task");
    let tasks = (0..TASKS).map(|n| NewTask::new("fleet.work", json!({"n": n, "ms": 30})).queue("fleet"));
    store.submit_batch(tasks).await.expect("submit");
    let fleet = start_fleet(&schema, "name:5").await;
    let pids: Vec<u32> = fleet.iter().map(|c| c.id().expect("running")).collect();
    // A third of the way in, kill the worker running the held task: its
    // tasks keep their slots until their 2 s leases run out and are
    // recovered.
    let mut killed = None;
    let (_, most, samples) = sample_until_drained(&schema, TASKS + 1, TASKS / 3, |running| {
        let Some((_, owner)) = running.iter().find(|(id, _)| *id == held.id) else { return false };
        // Worker ids are `waymark-<pid>-<random>/<claim>`.
        let pid = pids
            .iter()
            .copied()
            .find(|pid| owner.starts_with(&format!("waymark-{pid}-")))
            .expect("the held task's worker is one of the fleet");
        let _ = std::process::Command::new("kill").args(["-KILL", &pid.to_string()]).status();
        killed = Some(pid);
        true
    })
    .await;
    assert!(killed.is_some(), "the held task's worker was killed mid-drain");
    stop_fleet(fleet).await;
    assert!(most <= 5, "the fleet ran {most} tasks at once under a limit of 5");
    assert!(most >= 3, "the limit was hardly used ({most} at most): the test measured nothing");
    assert!(samples > 50, "too few samples ({samples}) to say anything");
    let held = store.fetch(&held.id).await.expect("the held task");
    assert_eq!(
        (held.status, held.attempt),
        (waymark_store::TaskStatus::Succeeded, 2),
        "the killed worker's held task ran again once its lease expired"
    );
    let rerun: i64 = admin_client(&schema.url)
        .await
        .query_one(
            &format!(
                "select count(*) from {}.cairnq_tasks where status = 'succeeded' and attempt > 1",
                schema.schema
            ),
            &[],
        )
        .await
        .expect("reruns")
        .get(0);
    println!("fleet limit 5: {samples} samples, at most {most} running; {rerun} tasks rerun after the kill");
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_tenant_limit_holds_for_each_tenant_while_tenants_run_side_by_side() {
    const TASKS: i64 = 240;
    let schema = TestSchema::new().await;
    let store = pool_store(&schema).await;
    // Tenant a has half the backlog, at its head: the others must still run.
    let tasks = (0..TASKS).map(|n| {
        let tenant = if n < TASKS / 2 { "a".to_owned() } else { format!("t{}", n % 5) };
        NewTask::new("fleet.work", json!({"tenant": tenant, "ms": 30})).queue("fleet")
    });
    store.submit_batch(tasks).await.expect("submit");
    let fleet = start_fleet(&schema, "tenant:2").await;
    let (per_tenant, most, samples) = sample_until_drained(&schema, TASKS, TASKS, |_| false).await;
    stop_fleet(fleet).await;
    for (tenant, seen) in &per_tenant {
        assert!(*seen <= 2, "tenant {tenant:?} ran {seen} tasks at once under a limit of 2 per tenant");
    }
    assert_eq!(per_tenant.len(), 6, "every tenant ran: {per_tenant:?}");
    assert!(most > 2, "tenants ran side by side ({most} at most in all): {per_tenant:?}");
    println!("per-tenant limit 2: {samples} samples, {per_tenant:?} at most per tenant, {most} in all");
    schema.drop().await;
}

/// A per-group limit: one tenant's backlog at the head of the queue, longer
/// than a limited claim looks at, with that tenant at its limit, does not
/// hide another tenant's task behind it; and a group never passes its
/// limit whatever the claim asks for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_groups_backlog_does_not_hide_the_other_groups() {
    use waymark_store::{ClaimRequest, FleetLimit, GroupKey};
    let schema = TestSchema::new().await;
    let store = pool_store(&schema).await;
    let busy: Vec<NewTask> =
        (0..5000).map(|i| NewTask::new("tenant.work", json!({"tenant": "busy", "n": i}))).collect();
    store.submit_batch(busy).await.expect("the busy tenant's backlog");
    let quiet = store.submit(NewTask::new("tenant.work", json!({"tenant": "quiet"}))).await.expect("submit");
    let limit = FleetLimit::name("tenant.work", 1).per_group(GroupKey::payload(["tenant"]));
    let claim = |limit_n: i64| {
        let req = ClaimRequest::new("w1", ["default"]).limit(limit_n).fleet_limit(limit.clone());
        let store = &store;
        async move { store.claim(&req).await }
    };

    let first = claim(1).await.expect("claim");
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].payload["tenant"], "busy", "the head of the queue goes first");
    // The busy tenant is at its limit: the next claim passes over its
    // backlog, however long, to the quiet tenant's task.
    let second = claim(10).await.expect("claim");
    let ids: Vec<&str> = second.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, [quiet.id.as_str()], "only the quiet tenant's task, the busy one being full");
    assert!(claim(10).await.expect("claim").is_empty(), "both tenants at their limit of 1");
    schema.drop().await;
}

/// A claimer frozen inside its turn under a fleet limit (here a session
/// holding the limit's advisory lock in an open transaction) holds up only
/// that limit's claims: the worker's plain queue keeps being claimed and
/// run, task after task, each well within a bound, without a claim error
/// reported; the limited task waits, and runs soon after the lock goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_claimer_under_a_limit_holds_up_only_that_limits_claims() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use waymark_store::FleetLimit;
    use waymark_tests::TestWorker;
    use waymark_worker::Worker;

    const PLAIN: usize = 20;
    // Each plain task is claimed and run within this of its submit.
    const PLAIN_BOUND: Duration = Duration::from_secs(2);
    let schema = TestSchema::new().await;
    let store = Arc::new(pool_store(&schema).await);

    // The stalled claimer: the limit's lock (its key is the limit's scope,
    // `FleetLimit::lock_key`), held in an open transaction.
    let stalled = admin_client(&schema.url).await;
    stalled
        .batch_execute(
            "begin; select pg_advisory_xact_lock(hashtextextended('waymark.fleet_limit:queue=limited name=*', 0))",
        )
        .await
        .expect("hold the limit's lock");
    let limited =
        store.submit(NewTask::new("limited.work", json!({})).queue("limited")).await.expect("submit limited");

    let claim_errors = Arc::new(AtomicUsize::new(0));
    let errors = claim_errors.clone();
    let (worker, mut events) = Worker::builder(store.clone())
        .queues(["plain", "limited"])
        .concurrency(2)
        .poll_interval(Duration::from_millis(500))
        .fleet_limit(FleetLimit::queue("limited", 1))
        .on_error(move |e| {
            if e.during == "claim" {
                errors.fetch_add(1, Ordering::SeqCst);
            }
        })
        .task("plain.work", |_ctx, p: serde_json::Value| async move { Ok(p) })
        .task("limited.work", |_ctx, p: serde_json::Value| async move { Ok(p) })
        .start_with_events();
    // One plain task at a time, each submitted once the last has settled:
    // every one needs a claim pass of its own while the limit is stalled.
    let mut slowest = Duration::ZERO;
    for n in 0..PLAIN {
        let task =
            store.submit(NewTask::new("plain.work", json!({"n": n})).queue("plain")).await.expect("submit");
        let took = settled(&mut events, task.id.clone(), PLAIN_BOUND).await.unwrap_or_else(|| {
            panic!("plain task {n} was not claimed and run within {PLAIN_BOUND:?} while a claimer stalled under the fleet limit")
        });
        slowest = slowest.max(took);
    }
    let status = store.get(&limited.id).await.expect("get").expect("the limited task").status;
    assert_eq!(status, waymark_store::TaskStatus::Queued, "the limited task waited for its turn");
    assert_eq!(claim_errors.load(Ordering::SeqCst), 0, "a missed turn is not a claim error");

    // The stalled claimer goes: the limited scope resumes.
    stalled.batch_execute("rollback").await.expect("release the limit's lock");
    let resumed = settled(&mut events, limited.id.clone(), Duration::from_secs(5))
        .await
        .expect("the limited task ran within 5 s of the lock's release");
    worker.stop().await;
    println!(
        "stalled limit: {PLAIN} plain tasks one after another, slowest {slowest:?} from submit to settled; \
         the limited task settled {resumed:?} after the lock went"
    );
    schema.drop().await;
}

/// How long after the call the task `id` settled, by the worker's events;
/// `None` if not within `bound`.
async fn settled(
    events: &mut tokio::sync::broadcast::Receiver<waymark_worker::WorkerEvent>,
    id: String,
    bound: Duration,
) -> Option<Duration> {
    let started = Instant::now();
    let found = tokio::time::timeout(bound, async {
        loop {
            match events.recv().await {
                Ok(waymark_worker::WorkerEvent::Settled { task_id, .. }) if task_id == id => return,
                Ok(_) => {}
                Err(e) => panic!("worker events: {e}"),
            }
        }
    })
    .await;
    found.ok().map(|()| started.elapsed())
}
