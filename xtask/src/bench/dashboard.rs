//! `bench dashboard`: the dashboard's (and `waymark list`'s) queries on a
//! table of a million tasks: each one the store's own operation, timed as
//! the page asks it. Not part of `bench all`: filling the table takes a
//! minute.

use std::time::{Duration, Instant};

use waymark_store::{ListFilter, TaskStatus};

use super::scenarios::fresh;

const TASKS: i64 = 1_000_000;
const RUNS: usize = 7;

pub(super) async fn dashboard() -> Result<(), String> {
    let server = crate::demo::find_postgres().await?;
    let (url, store) = fresh(&server, "waymark_bench_dashboard").await?;
    let client = waymark_tests::db::admin_client(&url).await;
    let started = Instant::now();
    waymark_tests::plans::mixed_table(&client, TASKS).await;
    println!(
        "bench dashboard: {TASKS} tasks in {:.1} s; each query {RUNS} times, median and worst\n",
        started.elapsed().as_secs_f64()
    );
    let store = &store;
    let list =
        |f: ListFilter| async move { store.list(&f).await.map(|t| t.len()).map_err(|e| e.to_string()) };
    let page = ListFilter { limit: 50, ..ListFilter::default() };
    let mut rows: Vec<(&str, Vec<Duration>)> = Vec::new();
    macro_rules! time {
        ($what:expr, $call:expr) => {{
            let mut times = Vec::new();
            for _ in 0..RUNS {
                let t = Instant::now();
                $call.await?;
                times.push(t.elapsed());
            }
            rows.push(($what, times));
        }};
    }
    time!("counts (stats, every queue)", async { store.stats(None).await.map_err(|e| e.to_string()) });
    time!("counts of one queue", async { store.stats(Some("q3")).await.map_err(|e| e.to_string()) });
    time!("newest 50", list(page.clone()));
    time!("failed, newest 50", list(ListFilter { status: Some(TaskStatus::Failed), ..page.clone() }));
    time!(
        "one queue's queued, newest 50",
        list(ListFilter { status: Some(TaskStatus::Queued), queue: Some("q3".into()), ..page.clone() })
    );
    time!("one name, newest 50", list(ListFilter { name: Some("name7".into()), ..page.clone() }));
    time!("page 200 (offset 10,000)", list(ListFilter { offset: 10_000, ..page.clone() }));
    time!("a task", async { store.get("task_00000000000000000000500000").await.map_err(|e| e.to_string()) });
    time!(
        "a task's tree (children)",
        list(ListFilter {
            root_id: Some("task_00000000000000000000499999".into()),
            limit: 500,
            ..ListFilter::default()
        })
    );
    println!("{:<34} {:>10} {:>10}", "query", "median ms", "worst ms");
    for (what, mut times) in rows {
        times.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        println!("{what:<34} {:>10.1} {:>10.1}", ms(times[times.len() / 2]), ms(times[times.len() - 1]));
    }
    Ok(())
}
