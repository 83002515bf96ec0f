//! `cargo xtask test`: ensure a PostgreSQL, then run every test.

use std::process::Command;

pub fn run(args: &[String]) -> Result<(), String> {
    let url = match std::env::var("DATABASE_URL") {
        Ok(url) if !url.is_empty() => {
            println!("xtask test: using DATABASE_URL");
            url
        }
        _ => {
            let url = waymark_tests::cluster::ensure_throwaway()?;
            println!("xtask test: using the throwaway cluster at {url}");
            url
        }
    };
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()));
    cmd.args(["test", "--workspace"])
        .args(args)
        .env("DATABASE_URL", &url)
        .current_dir(crate::workspace_root());
    if std::env::var_os("WAYMARK_CONFORMANCE_DIR").is_none() {
        let scenarios = crate::workspace_root().join("../shared/conformance/scenarios");
        if scenarios.is_dir() {
            let dir = scenarios.canonicalize().map_err(|e| format!("{}: {e}", scenarios.display()))?;
            println!("xtask test: conformance scenarios from {}", dir.display());
            cmd.env("WAYMARK_CONFORMANCE_DIR", dir);
        } else {
            println!(
                "xtask test: no ../shared/conformance/scenarios; the conformance test will say it skipped"
            );
        }
    }
    let status = cmd.status().map_err(|e| format!("running cargo test: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("cargo test failed ({status})"))
    }
}
