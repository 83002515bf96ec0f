//! Statements bound as a caller other than the store may bind them: what
//! protocol-sql promises for the values the store itself never sends.

use serde_json::json;
use tokio_postgres::types::{ToSql, Type};
use waymark_pool::PgPool;
use waymark_store::protocol::Statement;
use waymark_store::worker_protocol::WorkerProtocol;
use waymark_store::{ClaimRequest, ConnectOptions, NewTask, Store, TaskStatus};
use waymark_tests::TestDatabase;

/// `complete_batch` checks each id against its own owner in `worker_ids`:
/// an id whose owner is NULL or missing (the array shorter than `ids`)
/// settles nothing and is named lost; the others settle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn complete_batch_settles_each_id_under_its_own_owner() {
    let db = TestDatabase::new().await;
    let pool = PgPool::builder(&db.url).max_size(2).build().expect("pool");
    let store = Store::connect(pool, ConnectOptions::default()).await.expect("migrate");
    for i in 0..3 {
        store.submit(NewTask::new("s", json!({ "i": i }))).await.expect("submit");
    }
    let claimed = store.claim(&ClaimRequest::new("w1/1", ["default"]).limit(3)).await.expect("claim");
    let ids: Vec<String> = claimed.iter().map(|t| t.id.clone()).collect();
    let client = waymark_tests::db::admin_client(&db.url).await;
    let rewritten = waymark_dialect::rewrite(Statement::CompleteBatch.def().sql).expect("rewrite");
    let settle = |ids: Vec<String>, owners: Option<Vec<Option<String>>>| {
        let (client, rewritten) = (&client, &rewritten);
        async move {
            let results = json!({});
            let binds: [(&str, &(dyn ToSql + Sync)); 3] =
                [("results", &results), ("ids", &ids), ("worker_ids", &owners)];
            let names: Vec<&str> = binds.iter().map(|(n, _)| *n).collect();
            let order = rewritten.bind_order(&names).expect("every parameter bound");
            let def = Statement::CompleteBatch.def();
            let params: Vec<(&(dyn ToSql + Sync), Type)> = order
                .iter()
                .zip(rewritten.names())
                .map(|(&i, n)| (binds[i].1, waymark_pool::codec::pg_type(def.param(n).expect("declared").ty)))
                .collect();
            let rows = client.query_typed(rewritten.sql(), &params).await.expect("complete_batch");
            assert_eq!(rows.len(), 1, "complete_batch answers one row");
            rows[0].get::<_, Vec<String>>("lost")
        }
    };
    let owner = Some("w1/1".to_owned());
    assert_eq!(settle(vec![ids[0].clone()], None).await, vec![ids[0].clone()], "owners NULL: lost");
    assert_eq!(
        settle(vec![ids[0].clone()], Some(vec![None])).await,
        vec![ids[0].clone()],
        "owner NULL: lost"
    );
    let other = Some("w1/2".to_owned());
    assert_eq!(
        settle(vec![ids[0].clone()], Some(vec![other])).await,
        vec![ids[0].clone()],
        "another claim's"
    );
    let short = settle(vec![ids[1].clone(), ids[2].clone()], Some(vec![owner.clone()])).await;
    assert_eq!(short, vec![ids[2].clone()], "owners short: the id without one is lost");
    assert_eq!(
        settle(vec![ids[0].clone(), ids[2].clone()], Some(vec![owner.clone(); 2])).await,
        Vec::<String>::new()
    );
    // Settled already: a second complete settles nothing and names it lost.
    assert_eq!(
        settle(vec![ids[0].clone()], Some(vec![owner])).await,
        vec![ids[0].clone()],
        "a settled task is lost"
    );
    for id in &ids {
        let task = store.fetch(id).await.expect("get");
        assert_eq!((task.status, task.result), (TaskStatus::Succeeded, Some(json!(null))), "{id}");
    }
    db.drop().await;
}
