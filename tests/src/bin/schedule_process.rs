//! A scheduler process for the periodic-task tests: schedule `fast`, every
//! PERIOD_MS, submitting `py.ok` (payload `{"x": 1}`, a handler of the
//! cairnq Python worker in `tests/python/interop.py`), catching up the last
//! CATCH_UP missed slots. Usage: `schedule_process URL PERIOD_MS CATCH_UP`.
//! Runs until SIGTERM or SIGINT.

use std::sync::Arc;
use std::time::Duration;

use waymark_pool::PgPool;
use waymark_schedule::{CatchUp, Every, Periodic, Scheduler};
use waymark_store::{ConnectOptions, NewTask, Store};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let parsed = match args.as_slice() {
        [url, period, catch_up] => {
            period.parse::<u64>().ok().zip(catch_up.parse::<usize>().ok()).map(|p| (url, p))
        }
        _ => None,
    };
    let Some((url, (period, catch_up))) = parsed else {
        eprintln!("usage: schedule_process <url> <period_ms> <catch_up>");
        std::process::exit(2);
    };
    let pool = PgPool::builder(url.as_str()).max_size(2).build().expect("pool");
    let store = Arc::new(Store::connect(pool, ConnectOptions::default()).await.expect("connect"));
    let every = Every::interval(Duration::from_millis(period)).expect("interval");
    let fast = Periodic::new("fast", every, NewTask::new("py.ok", serde_json::json!({"x": 1})))
        .catch_up(CatchUp::Missed(catch_up));
    println!("ready");
    let stop = async {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    Scheduler::new(store).schedule(fast).run_until(stop).await.expect("scheduler");
}
