//! `Worker::serve` in a process of its own, on a real PostgreSQL: SIGTERM in
//! the middle of a drain shuts it down gracefully (every task then settled
//! or queued, none left running), and a second signal stops it at once,
//! giving its held tasks back.

use std::time::{Duration, Instant};

use serde_json::json;
use tokio::io::BufReader;
use waymark_store::{ListFilter, NewTask, TaskStatus};
use waymark_tests::{eventually, pool_store, TestSchema};

/// Starts `serve_worker` on the schema and waits for its "ready".
async fn serve_worker(
    schema: &TestSchema,
) -> (tokio::process::Child, tokio::io::Lines<BufReader<tokio::process::ChildStdout>>) {
    waymark_tests::child::start_ready(env!("CARGO_BIN_EXE_serve_worker"), &[&schema.url, &schema.schema])
        .await
}

fn queued_in_serve() -> ListFilter {
    ListFilter { status: Some(TaskStatus::Queued), queue: Some("serve".into()), ..ListFilter::default() }
}

/// Sends `signal` (TERM, INT) to the process, through the shell's `kill`.
fn send(child: &tokio::process::Child, signal: &str) {
    let pid = child.id().expect("running");
    let status = std::process::Command::new("bash")
        .args(["-c", &format!("kill -{signal} {pid}")])
        .status()
        .expect("bash");
    assert!(status.success(), "kill -{signal} {pid}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_drain_finishes_what_runs_and_leaves_every_task_settled_or_queued() {
    // 150 ms each on four slots: over 3.5 s of work, so the signal comes
    // mid-drain even when a loaded machine reads the stats late.
    const TASKS: usize = 100;
    let schema = TestSchema::new().await;
    let store = pool_store(&schema).await;
    let tasks: Vec<NewTask> =
        (0..TASKS).map(|i| NewTask::new("serve.work", json!({"ms": 150, "i": i})).queue("serve")).collect();
    store.submit_batch(tasks).await.expect("submit");
    let (mut child, mut lines) = serve_worker(&schema).await;
    eventually(Duration::from_secs(30), "the drain under way", || async {
        let c = store.stats(Some("serve")).await.expect("stats")["serve"];
        c.succeeded >= 8 && c.running >= 1
    })
    .await;
    send(&child, "TERM");
    let status =
        tokio::time::timeout(Duration::from_secs(20), child.wait()).await.expect("exits").expect("wait");
    assert!(status.success(), "a graceful exit: {status}");
    assert_eq!(lines.next_line().await.expect("read").as_deref(), Some("stopped"));

    let c = store.stats(Some("serve")).await.expect("stats")["serve"];
    assert_eq!(c.running, 0, "nothing left running: {c:?}");
    assert_eq!(c.succeeded + c.queued, TASKS as i64, "every task settled or queued: {c:?}");
    assert!(c.queued > 0, "the signal came mid-drain: {c:?}");
    // What is queued was never claimed, or was given back unspent.
    let queued = store.list(&queued_in_serve()).await.expect("list");
    assert!(queued.iter().all(|t| t.attempt == 0), "attempts unspent");
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_stops_at_once_and_gives_the_held_tasks_back() {
    let schema = TestSchema::new().await;
    let store = pool_store(&schema).await;
    for _ in 0..2 {
        store.submit(NewTask::new("serve.hold", json!({})).queue("serve")).await.expect("submit");
    }
    let (mut child, _lines) = serve_worker(&schema).await;
    eventually(Duration::from_secs(30), "both held", || async {
        store.stats(Some("serve")).await.expect("stats")["serve"].running == 2
    })
    .await;
    send(&child, "TERM");
    // Real time is under test: the grace (30 s) holds the process while
    // its handlers run, deaf to their tokens.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(child.try_wait().expect("try_wait").is_none(), "the first signal waits out the grace");
    let second = Instant::now();
    send(&child, "INT");
    let status =
        tokio::time::timeout(Duration::from_secs(10), child.wait()).await.expect("exits").expect("wait");
    assert!(status.success(), "{status}");
    assert!(second.elapsed() < Duration::from_secs(3), "stopped at once: {:?}", second.elapsed());
    let c = store.stats(Some("serve")).await.expect("stats")["serve"];
    assert_eq!((c.running, c.queued), (0, 2), "both given back: {c:?}");
    let queued = store.list(&queued_in_serve()).await.expect("list");
    assert!(queued.iter().all(|t| t.attempt == 0), "attempts unspent");
    schema.drop().await;
}
