//! `bench explain`: the hot statements' plans on a stale backlog.

use super::scenarios::fresh;

/// `EXPLAIN (ANALYZE, BUFFERS)` of the probe, the claim and the batched
/// writes on a 100,000-row backlog whose statistics are stale (see
/// `waymark_tests::plans`); each write is rolled back.
pub(super) async fn explain() -> Result<(), String> {
    const TOTAL: i64 = 100_000;
    const QUEUED: i64 = 50_000;
    const RUNNING: i64 = 512;
    let server = crate::demo::find_postgres().await?;
    let (url, _store) = fresh(&server, "waymark_bench_explain").await?;
    let mut client = waymark_tests::db::admin_client(&url).await;
    let running = waymark_tests::plans::stale_backlog(&client, TOTAL, QUEUED, RUNNING).await;
    println!(
        "explain: {TOTAL} tasks ({QUEUED} queued, then {RUNNING} of them claimed by each of two workers, \
         the rest succeeded), statistics taken while every task was queued\n"
    );
    for plan in waymark_tests::plans::explain_hot_statements(&mut client, &running, true).await {
        println!("-- {}", plan.statement);
        for line in plan.text.lines() {
            // A bound id array prints in full; its first ids are enough.
            match line.char_indices().nth(150) {
                Some((cut, _)) => println!("{} ...", &line[..cut]),
                None => println!("{line}"),
            }
        }
        println!();
    }
    Ok(())
}
