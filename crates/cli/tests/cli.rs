//! The `waymark` command as an operator runs it, on a real PostgreSQL: each
//! command's tables, `--json` and exit code, the errors that change
//! nothing, and `watch` redrawing in a real terminal (tmux).

use std::process::{Command, Output};
use std::time::Duration;

use serde_json::{json, Value as Json};
use waymark_store::worker_protocol::WorkerProtocol;
use waymark_store::{ClaimRequest, Failure, NewTask, TaskStatus};
use waymark_tests::{eventually, pool_store, TestSchema};

/// Runs `waymark` with the schema's database and `args`.
fn waymark(schema: &TestSchema, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_waymark"))
        .args(["--database-url", &schema.url, "--schema", &schema.schema])
        .args(args)
        .output()
        .expect("run waymark")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs it, expects `code`, and answers stdout.
fn expect(schema: &TestSchema, args: &[&str], code: i32) -> String {
    let out = waymark(schema, args);
    assert_eq!(
        out.status.code(),
        Some(code),
        "waymark {args:?}:\nstdout: {}\nstderr: {}",
        stdout(&out),
        stderr(&out)
    );
    stdout(&out)
}

fn json_of(s: &str) -> Json {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("not JSON ({e}): {s}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_inspect_cancel_retry_and_purge_as_an_operator_would() {
    let schema = TestSchema::new().await;
    // Not installed yet: every command but migrate says so and changes nothing.
    let out = waymark(&schema, &["stats"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("no waymark installation here"), "{}", stderr(&out));
    let applied = expect(&schema, &["migrate"], 0);
    assert!(
        applied.contains("applied 0001_init.sql") && applied.contains("applied 0010_drop_status_index.sql"),
        "{applied}"
    );
    assert_eq!(expect(&schema, &["migrate"], 0), "up to date: no migration to apply\n");
    let status = json_of(&expect(&schema, &["migrate", "--status", "--json"], 0));
    let files = 10 + waymark_store::protocol::ledger_migrations().len();
    assert_eq!(status.as_array().map(Vec::len), Some(files), "cairnq's files and waymark's ledgers");
    assert!(status.as_array().unwrap().iter().all(|m| m["applied_at_ms"].is_i64()), "{status}");
    assert_eq!(expect(&schema, &["stats"], 0), "no tasks\n");

    let store = pool_store(&schema).await;
    let running = store.submit(NewTask::new("mail.send", json!({})).queue("mail")).await.unwrap();
    let claimed =
        store.claim(&ClaimRequest::new("w-1", ["mail"]).limit(1).names(["mail.send"])).await.unwrap();
    assert_eq!(claimed[0].id, running.id);
    let queued = store
        .submit(NewTask::new("mail.send", json!({"to": "ada"})).queue("mail").key("order-1"))
        .await
        .unwrap();
    let mut failed = Vec::new();
    for i in 0..3 {
        let t = store.submit(NewTask::new("bill", json!({ "i": i })).queue("bulk")).await.unwrap();
        let claimed = store.claim(&ClaimRequest::new("w-2", ["bulk"]).limit(1)).await.unwrap();
        store
            .fail(
                &claimed[0].lease().unwrap(),
                &Failure::new(json!({"message": "card declined"})).retryable(false),
            )
            .await
            .unwrap();
        failed.push(t.id);
    }

    // stats: a table with a total row, and JSON.
    let table = expect(&schema, &["stats"], 0);
    assert!(table.starts_with("queue  queued  running  succeeded  failed  canceled\n"), "{table}");
    assert!(table.contains("bulk   0       0        0          3       0"), "{table}");
    assert!(table.contains("(all)  1       1        0          3       0"), "{table}");
    let counts = json_of(&expect(&schema, &["stats", "--queue", "mail", "--json"], 0));
    assert_eq!(counts["mail"]["queued"], 1);
    assert_eq!(counts["mail"]["running"], 1);

    // list and get.
    let list = json_of(&expect(&schema, &["list", "--status", "failed", "--json"], 0));
    assert_eq!(list.as_array().map(Vec::len), Some(3));
    let human = expect(&schema, &["list", "--queue", "bulk"], 0);
    assert!(human.contains("card declined") && human.contains("1/3"), "{human}");
    let bad = waymark(&schema, &["list", "--status", "done"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(stderr(&bad)
        .contains("unknown status \"done\" (known: queued, running, succeeded, failed, canceled)"));
    let task = expect(&schema, &["get", "--key", "order-1"], 0);
    assert!(task.contains(&format!("id            {}", queued.id)), "{task}");
    assert!(task.contains("payload       {\"to\":\"ada\"}"), "{task}");
    let missing = waymark(&schema, &["get", "task_nope"]);
    assert_eq!(missing.status.code(), Some(3));
    assert!(stderr(&missing).contains("no task task_nope"));

    // cancel: a queued task at once, a running one asked to stop.
    assert_eq!(expect(&schema, &["cancel", &queued.id], 0), format!("canceled {}\n", queued.id));
    let again = waymark(&schema, &["cancel", &queued.id]);
    assert_eq!(again.status.code(), Some(3));
    assert!(stderr(&again).contains("is canceled already: nothing to cancel"), "{}", stderr(&again));
    assert!(expect(&schema, &["cancel", &running.id], 0).contains("asked"));
    assert!(store.fetch(&running.id).await.unwrap().cancel_requested_at_ms.is_some());

    // retry one, then refuse one that is not failed.
    assert_eq!(expect(&schema, &["retry", &failed[0]], 0), format!("queued {} again\n", failed[0]));
    let not_failed = waymark(&schema, &["retry", &failed[0]]);
    assert_eq!(not_failed.status.code(), Some(3));
    assert!(stderr(&not_failed).contains("only failed or canceled tasks can be retried"));

    // A bulk retry shows its count and changes nothing without --yes.
    let dry = waymark(&schema, &["retry", "--filter", "--queue", "bulk"]);
    assert_eq!(dry.status.code(), Some(4));
    assert!(
        stderr(&dry).contains("2 failed task(s) match; nothing was retried: pass --yes"),
        "{}",
        stderr(&dry)
    );
    assert_eq!(store.stats(Some("bulk")).await.unwrap()["bulk"].failed, 2);
    let done = json_of(&expect(&schema, &["retry", "--filter", "--queue", "bulk", "--yes", "--json"], 0));
    assert_eq!(done, json!({"matched": 2, "retried": 2, "skipped": 0}));
    assert_eq!(store.stats(Some("bulk")).await.unwrap()["bulk"].queued, 3);
    let bad = waymark(&schema, &["retry", "--filter", "--status", "running", "--yes"]);
    assert_eq!(bad.status.code(), Some(2));

    // purge: terminal tasks only, by age; a bad age is refused.
    let kept = store.fetch(&queued.id).await.unwrap();
    assert_eq!(kept.status, TaskStatus::Canceled);
    assert_eq!(expect(&schema, &["purge", "--older-than", "1h", "--yes"], 0), "deleted 0 task(s)\n");
    assert_eq!(
        json_of(&expect(&schema, &["purge", "--older-than", "0s", "--yes", "--json"], 0)),
        json!({"deleted": 1})
    );
    assert!(store.get(&queued.id).await.unwrap().is_none());
    let bad = waymark(&schema, &["purge", "--older-than", "10w"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(stderr(&bad).contains("--older-than must be a number and a unit"));
    assert_eq!(
        store.stats(None).await.unwrap().values().map(|c| c.queued + c.running).sum::<i64>(),
        4,
        "live tasks untouched"
    );
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_shows_its_count_and_deletes_only_with_yes() {
    let schema = TestSchema::new().await;
    let store = pool_store(&schema).await;
    for i in 0..3 {
        store.submit(NewTask::new("report", json!({ "i": i })).queue("old")).await.unwrap();
    }
    for t in store.claim(&ClaimRequest::new("w", ["old"]).limit(3)).await.unwrap() {
        store.complete(&t.lease().unwrap(), json!(null)).await.unwrap();
    }
    let live = store.submit(NewTask::new("report", json!({})).queue("old")).await.unwrap();
    let finished = || async { store.stats(Some("old")).await.unwrap()["old"].succeeded };

    // Without --yes: the count, exit 4, nothing deleted; as JSON too.
    let dry = waymark(&schema, &["purge", "--older-than", "0s"]);
    assert_eq!(dry.status.code(), Some(4), "stdout: {}\nstderr: {}", stdout(&dry), stderr(&dry));
    assert!(
        stderr(&dry)
            .contains("3 terminal task(s) finished more than 0s ago; nothing was deleted: pass --yes"),
        "{}",
        stderr(&dry)
    );
    assert_eq!(finished().await, 3);
    let dry = waymark(&schema, &["purge", "--older-than", "0s", "--queue", "old", "--json"]);
    assert_eq!(dry.status.code(), Some(4));
    let doc = json_of(&stdout(&dry));
    assert_eq!((doc["exit_code"].clone(), doc["matched"].clone()), (json!(4), json!(3)), "{doc}");
    assert_eq!(finished().await, 3);
    // Nothing old enough: nothing to confirm.
    assert_eq!(
        expect(&schema, &["purge", "--older-than", "1h"], 0),
        "0 terminal tasks finished more than 1h ago: nothing to delete\n"
    );
    assert_eq!(
        json_of(&expect(&schema, &["purge", "--older-than", "1h", "--json"], 0)),
        json!({"matched": 0, "deleted": 0})
    );
    // The filters narrow the count as they narrow the delete.
    let other = waymark(&schema, &["purge", "--older-than", "0s", "--queue", "elsewhere"]);
    assert_eq!(other.status.code(), Some(0), "{}", stderr(&other));

    // With --yes: deleted, the live task untouched.
    assert_eq!(
        json_of(&expect(&schema, &["purge", "--older-than", "0s", "--yes", "--json"], 0)),
        json!({"deleted": 3})
    );
    assert_eq!(finished().await, 0);
    assert_eq!(store.fetch(&live.id).await.unwrap().status, TaskStatus::Queued);
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_name_what_was_wrong_and_exit_with_their_code() {
    let schema = TestSchema::new().await;
    // No database named at all.
    let out =
        Command::new(env!("CARGO_BIN_EXE_waymark")).arg("stats").env_remove("DATABASE_URL").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("no database: pass --database-url or set DATABASE_URL"));
    // A server that is not there.
    let out = Command::new(env!("CARGO_BIN_EXE_waymark"))
        .args(["--database-url", "postgres://postgres@127.0.0.1:1/none", "stats", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("cannot reach the database"), "{}", stderr(&out));
    assert_eq!(json_of(&stdout(&out))["exit_code"], 1, "--json callers get the error as JSON too");
    // Usage errors are clap's (exit 2), naming the command.
    let out = waymark(&schema, &["frobnicate"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("unrecognized subcommand 'frobnicate'"), "{}", stderr(&out));
    // An empty schema (an unset variable) is refused, not read as the default.
    let out = Command::new(env!("CARGO_BIN_EXE_waymark"))
        .args(["--database-url", &schema.url, "--schema", "", "stats"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--schema (or WAYMARK_SCHEMA) is empty"), "{}", stderr(&out));
    // Filters go with --filter only; a dashboard bind is checked first.
    let out = waymark(&schema, &["retry", "task_x", "--queue", "q"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("filters go with --filter"), "{}", stderr(&out));
    let out = Command::new(env!("CARGO_BIN_EXE_waymark"))
        .args(["--database-url", "postgres://postgres@127.0.0.1:1/none", "ui", "--bind", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "refused before connecting");
    assert!(stderr(&out).contains("without a token"), "{}", stderr(&out));
    let help = stdout(&waymark(&schema, &["--help"]));
    assert!(help.contains("Exit codes:") && help.contains("4  a bulk retry or a purge"), "{help}");
    let help = stdout(&waymark(&schema, &["purge", "--help"]));
    assert!(help.contains("Shows the count; deletes only with --yes"), "{help}");
    schema.drop().await;
}

/// tmux, or a loud failure: the harness installs it (`cargo xtask setup`).
fn tmux(args: &[&str]) -> Output {
    Command::new("tmux").args(args).output().expect("tmux is installed (cargo xtask setup installs it)")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_redraws_in_a_terminal_as_tasks_are_queued_and_finish() {
    let schema = TestSchema::new().await;
    let store = pool_store(&schema).await;
    store.submit(NewTask::new("x", json!({})).queue("seen")).await.unwrap();
    let session = format!("waymark-watch-{}", std::process::id());
    let command = format!(
        "{} --database-url '{}' --schema '{}' watch --every 30s",
        env!("CARGO_BIN_EXE_waymark"),
        schema.url,
        schema.schema
    );
    let started = tmux(&["new-session", "-d", "-s", &session, "-x", "120", "-y", "20", &command]);
    assert!(started.status.success(), "tmux: {}", stderr(&started));
    let screen = || stdout(&tmux(&["capture-pane", "-p", "-t", &session]));
    eventually(Duration::from_secs(20), "the first frame", || async {
        screen().contains("seen   1       0")
    })
    .await;

    // Signals, not the 30 s poll, bring each change to the screen.
    for _ in 0..2 {
        store.submit(NewTask::new("x", json!({})).queue("seen")).await.unwrap();
    }
    eventually(Duration::from_secs(10), "three queued", || async { screen().contains("seen   3       0") })
        .await;
    let claimed = store.claim(&ClaimRequest::new("w", ["seen"]).limit(3)).await.unwrap();
    for t in &claimed {
        store.complete(&t.lease().unwrap(), json!(null)).await.unwrap();
    }
    eventually(Duration::from_secs(10), "three succeeded", || async {
        screen().contains("seen   0       0        3")
    })
    .await;
    // A queue that appears joins the watch.
    store.submit(NewTask::new("x", json!({})).queue("later")).await.unwrap();
    eventually(Duration::from_secs(10), "the new queue", || async { screen().contains("later  1") }).await;
    let frame = screen();
    assert!(frame.contains("waymark watch,") && frame.contains("(Ctrl-C to stop)"), "{frame}");
    tmux(&["send-keys", "-t", &session, "C-c", ""]);
    eventually(Duration::from_secs(10), "watch to end on Ctrl-C", || async {
        !tmux(&["has-session", "-t", &session]).status.success()
    })
    .await;
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_tasks_are_seen_and_operated_from_the_command_line() {
    let schema = TestSchema::new().await;
    let store = pool_store(&schema).await;
    let first = NewTask::new("charge", json!({})).queue("held").ordered_by("account:7");
    let second = NewTask::new("ship", json!({})).queue("held").ordered_by("account:7");
    let paid = NewTask::new("thank", json!({})).queue("held").on_event("invoice.paid:7");
    for held in [first.clone(), second.clone(), paid.clone()] {
        store.hold(held).await.expect("hold");
    }
    let table = expect(&schema, &["held", "list"], 0);
    assert!(table.contains("its turn in key account:7") && table.contains("event invoice.paid:7"), "{table}");
    assert!(!table.contains(first.id()), "the key's head is released, not held:\n{table}");
    let shown = json_of(&expect(&schema, &["held", "show", second.id(), "--json"], 0));
    assert_eq!(shown["state"], "held");
    assert_eq!(shown["order_key"], "account:7");

    // Wrong state, unknown id, bad filter: named, nothing changed.
    let out = waymark(&schema, &["held", "release", first.id()]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("released"), "{}", stderr(&out));
    assert_eq!(waymark(&schema, &["held", "drop", "task_nope"]).status.code(), Some(3));
    assert_eq!(waymark(&schema, &["held", "list", "--state", "waiting"]).status.code(), Some(2));
    assert_eq!(waymark(&schema, &["emit", "x", "--payload", "{not json"]).status.code(), Some(2));

    let emitted =
        json_of(&expect(&schema, &["emit", "invoice.paid:7", "--payload", "{\"n\":1}", "--json"], 0));
    assert_eq!(emitted["reached"], 1);
    assert_eq!(store.fetch(paid.id()).await.expect("released").status, TaskStatus::Queued);
    assert_eq!(expect(&schema, &["held", "drop", second.id()], 0), format!("{}: canceled\n", second.id()));
    let left = json_of(&expect(&schema, &["held", "list", "--json"], 0));
    assert_eq!(left, json!([]), "nothing held");
    schema.drop().await;
}
