//! JSON values of every kind in the JSON columns, as cairnq's SDKs write them.

use std::collections::BTreeMap;

use serde_json::{json, Value as Json};
use waymark_store::worker_protocol::WorkerProtocol;
use waymark_store::{ListFilter, NewTask, PgExecutor, Settlement, Store, TaskStatus};

use super::{claim, raw};

/// A value of every JSON kind, with look-alikes of other kinds among them
/// (the string `"42"`, the string `"null"`, an empty string, array and
/// object, JSON null): what any SDK may write as a payload, metadata or
/// result.
pub fn every_json_kind() -> Vec<serde_json::Value> {
    vec![
        json!(null),
        json!("42"),
        json!(42),
        json!(-1.5),
        json!(true),
        json!(""),
        json!("null"),
        json!([1, "a", null]),
        json!([]),
        json!({}),
        json!({ "k": [null, { "n": "7" }] }),
    ]
}

/// A payload, metadata and result may each be any JSON value (null, a
/// string, a number, a boolean, an array, an object), and each reads back
/// as written, a string `"42"` as a string: through a submit, a keyed
/// submit, a batch and a batch of alike tasks, a claim, a complete and a
/// batched complete, a get and a list. Rows another SDK or plain SQL wrote
/// so read as well, with nothing `unreadable`.
pub async fn every_json_value_is_kept_as_written<E: PgExecutor>(store: &Store<E>) {
    let values = every_json_kind();
    let n = values.len();
    // id -> (payload, metadata) as submitted.
    let mut want: BTreeMap<String, (Json, Json)> = BTreeMap::new();
    for (i, metadata) in values.iter().enumerate() {
        let payload = values[n - 1 - i].clone();
        let t = store
            .submit(NewTask::new("j", payload.clone()).metadata(metadata.clone()))
            .await
            .expect("submit");
        assert_eq!((&t.payload, &t.metadata), (&payload, metadata), "a submit answers what it wrote");
        want.insert(t.id, (payload, metadata.clone()));
    }
    let keyed = store
        .submit(NewTask::new("j", json!("42")).metadata(json!([])).key("json-values"))
        .await
        .expect("a keyed submit");
    want.insert(keyed.id, (json!("42"), json!([])));
    let mixed = values.iter().map(|v| NewTask::new("j", v.clone()).metadata(json!([v])));
    let ids = store.submit_batch(mixed).await.expect("a batch");
    want.extend(ids.into_iter().zip(&values).map(|(id, v)| (id, (v.clone(), json!([v])))));
    let alike = values.iter().map(|v| NewTask::new("j", v.clone()).metadata(json!("shared")));
    let ids = store.submit_batch(alike).await.expect("a batch of alike tasks");
    want.extend(ids.into_iter().zip(&values).map(|(id, v)| (id, (v.clone(), json!("shared")))));

    for (id, (payload, metadata)) in &want {
        let t = store.fetch(id).await.expect("get");
        assert_eq!((&t.payload, &t.metadata), (payload, metadata), "read back as written: {id}");
        assert!(t.unreadable.is_empty(), "{:?}", t.unreadable);
    }
    let claimed = store.claim(&claim("w1").limit(1000)).await.expect("claim");
    assert_eq!(claimed.len(), want.len(), "every task claimed");
    for t in &claimed {
        let (payload, metadata) = &want[&t.id];
        assert_eq!((&t.payload, &t.metadata), (payload, metadata), "a claim hands out what was written");
        assert!(!t.input_unreadable(), "{:?}", t.unreadable);
    }
    // Each task's result is its payload: one by one, and in one batch.
    let (one_by_one, batched) = claimed.split_at(claimed.len() / 2);
    for t in one_by_one {
        store.complete(&t.lease().expect("running"), t.payload.clone()).await.expect("complete");
    }
    let items: Vec<Settlement> = batched
        .iter()
        .map(|t| Settlement::Complete { lease: t.lease().expect("running"), result: t.payload.clone() })
        .collect();
    for out in store.settle_batch(&items).await.expect("the batch commits") {
        out.expect("each complete settles");
    }
    let done = store.list(&ListFilter { limit: 1000, ..ListFilter::default() }).await.expect("list");
    assert_eq!(done.len(), want.len());
    for t in &done {
        let (payload, metadata) = &want[&t.id];
        assert_eq!(t.status, TaskStatus::Succeeded);
        assert_eq!((&t.payload, &t.metadata), (payload, metadata), "a list reads them as written");
        // A JSON null result and no result are one to cairnq.
        assert_eq!(t.result.as_ref().unwrap_or(&Json::Null), payload, "the result as written: {}", t.id);
    }

    // Rows written by plain SQL, as another SDK may: read as written.
    let row = |id: &str, payload: &str, metadata: &str, result: &str| {
        format!(
            "insert into cairnq_tasks (id, name, queue, status, payload, metadata, result, run_at_ms, root_id, \
             created_at_ms, updated_at_ms, completed_at_ms) \
             values ('{id}', 'j', 'sql', 'succeeded', {payload}, {metadata}, {result}, 0, '{id}', 0, 0, 0);"
        )
    };
    raw(
        store,
        &[
            row("task_01SQLJSONVALUES0000000001", "'\"s3://b/k\"'", "'null'", "'\"42\"'"),
            row("task_01SQLJSONVALUES0000000002", "'null'", "'[\"a\", 1]'", "null"),
            row("task_01SQLJSONVALUES0000000003", "'[]'", "'\"x\"'", "'null'"),
        ]
        .concat(),
    )
    .await;
    let read = |id: &'static str| async move { store.fetch(id).await.expect("a row plain SQL wrote") };
    let t = read("task_01SQLJSONVALUES0000000001").await;
    assert_eq!((t.payload, t.metadata, t.result), (json!("s3://b/k"), json!(null), Some(json!("42"))));
    let t = read("task_01SQLJSONVALUES0000000002").await;
    assert_eq!((t.payload, t.metadata, t.result), (json!(null), json!(["a", 1]), None));
    let t = read("task_01SQLJSONVALUES0000000003").await;
    assert_eq!((&t.payload, &t.metadata), (&json!([]), &json!("x")));
    assert_eq!(t.result.unwrap_or(Json::Null), Json::Null);
    let listed = store.list(&ListFilter { queue: Some("sql".into()), ..ListFilter::default() }).await;
    assert!(listed.expect("list").iter().all(|t| t.unreadable.is_empty()));
}
