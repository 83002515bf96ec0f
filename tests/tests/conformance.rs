//! Runs every cairnq conformance scenario in `WAYMARK_CONFORMANCE_DIR`, each on
//! a fresh installation, through both executors: the built-in pool and the
//! bare-client executor of the tests.

use std::path::PathBuf;

use futures::stream::{self, StreamExt};
use waymark_tests::conformance::{load_scenarios, run_scenario, Scenario};
use waymark_tests::{client_store, pool_store, TestSchema};

const EXECUTORS: [&str; 2] = ["pool", "client"];

async fn run_one(scenario: Scenario, executor: &'static str) -> (String, Result<(), String>) {
    let schema = TestSchema::new().await;
    let outcome = match executor {
        "pool" => run_scenario(&pool_store(&schema).await, &scenario).await,
        _ => run_scenario(&client_store(&schema).await, &scenario).await,
    };
    schema.drop().await;
    (format!("{} [{executor}]", scenario.name), outcome)
}

fn main() -> std::process::ExitCode {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build();
    runtime.expect("tokio runtime").block_on(conformance_scenarios())
}

async fn conformance_scenarios() -> std::process::ExitCode {
    let Some(dir) = std::env::var_os("WAYMARK_CONFORMANCE_DIR").map(PathBuf::from) else {
        eprintln!(
            "SKIPPED: WAYMARK_CONFORMANCE_DIR is not set, so no conformance scenario ran. \
             `cargo xtask test` sets it to ../shared/conformance/scenarios."
        );
        return std::process::ExitCode::SUCCESS;
    };
    let scenarios = load_scenarios(&dir).unwrap_or_else(|e| panic!("{e}"));
    assert!(!scenarios.is_empty(), "WAYMARK_CONFORMANCE_DIR={} holds no *.json scenarios", dir.display());

    let jobs = scenarios.iter().flat_map(|s| EXECUTORS.map(|e| (s.clone(), e)));
    let results: Vec<_> = stream::iter(jobs).map(|(s, e)| run_one(s, e)).buffered(6).collect().await;

    let mut failed = 0;
    for (label, outcome) in &results {
        match outcome {
            Ok(()) => println!("PASS {label}"),
            Err(why) => {
                failed += 1;
                println!("FAIL {label}: {why}");
            }
        }
    }
    println!("{} passed, {failed} failed", results.len() - failed);
    if failed == 0 {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}
