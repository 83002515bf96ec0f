//! What the commands share: the store they open, what they print, and the
//! reading of the values their flags take.

use std::time::Duration;

use waymark_pool::PgPool;
use waymark_store::{ConnectOptions, ListFilter, Store, TaskStatus};

use crate::args::Filters;
use crate::error::CliError;

/// What a command printed, and that it went well.
pub type Out = Result<String, CliError>;

/// A store on a small pool, over an installation that must already be
/// there: no command but `migrate` changes the schema.
pub async fn open(url: &str, schema: Option<&str>) -> Result<Store<PgPool>, CliError> {
    open_sized(url, schema, 2).await
}

/// [`open`] with `connections` pooled (the dashboard serves several pages).
pub(crate) async fn open_sized(
    url: &str,
    schema: Option<&str>,
    connections: u32,
) -> Result<Store<PgPool>, CliError> {
    let options = options(schema).migrate(false);
    Ok(Store::connect(pool(url, schema, connections)?, options).await?)
}

/// The store's settings for `--schema`, if given.
pub(crate) fn options(schema: Option<&str>) -> ConnectOptions {
    match schema {
        Some(s) => ConnectOptions::new().schema(s),
        None => ConnectOptions::new(),
    }
}

pub(crate) fn pool(url: &str, schema: Option<&str>, connections: u32) -> Result<PgPool, CliError> {
    let mut builder = PgPool::builder(url).max_size(connections);
    if let Some(s) = schema {
        builder = builder.schema(s);
    }
    builder.build().map_err(|e| CliError::usage(format!("bad --database-url: {e}")))
}

pub(crate) fn doc(v: &impl serde::Serialize) -> String {
    let mut s = serde_json::to_string_pretty(v).expect("the store's types serialise");
    s.push('\n');
    s
}

/// A status named on the command line, or exit 2 naming the known ones.
pub(crate) fn status_of(s: &Option<String>) -> Result<Option<TaskStatus>, CliError> {
    s.as_deref()
        .map(|s| {
            s.parse::<TaskStatus>().map_err(|_| {
                let known: Vec<&str> = TaskStatus::ALL.iter().map(|s| s.as_str()).collect();
                CliError::usage(format!("unknown status {s:?} (known: {})", known.join(", ")))
            })
        })
        .transpose()
}

pub(crate) fn list_filter(f: &Filters, limit: i64, offset: i64) -> Result<ListFilter, CliError> {
    if limit < 0 || offset < 0 {
        return Err(CliError::usage(format!(
            "--limit and --offset must not be negative, got {limit} and {offset}"
        )));
    }
    Ok(ListFilter {
        status: status_of(&f.status)?,
        queue: f.queue.clone(),
        name: f.name.clone(),
        root_id: f.root.clone(),
        correlation_id: f.correlation.clone(),
        limit,
        offset,
    })
}

/// `90s`, `30m`, `12h`, `7d`, `500ms`: a number and a unit.
pub fn duration(s: &str, flag: &str) -> Result<Duration, CliError> {
    let bad = || {
        CliError::usage(format!(
            "{flag} must be a number and a unit (ms, s, m, h, d), such as 30m; got {s:?}"
        ))
    };
    let digits = s.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (n, unit) = s.split_at(digits);
    let n: u64 = n.parse().map_err(|_| bad())?;
    let secs = |k: u64| n.checked_mul(k).map(Duration::from_secs).ok_or_else(bad);
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" => secs(1),
        "m" => secs(60),
        "h" => secs(3600),
        "d" => secs(86_400),
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Kind;

    #[test]
    fn durations_take_a_number_and_a_unit() {
        assert_eq!(duration("90s", "--x").unwrap(), Duration::from_secs(90));
        assert_eq!(duration("7d", "--x").unwrap(), Duration::from_secs(7 * 86_400));
        assert_eq!(duration("250ms", "--x").unwrap(), Duration::from_millis(250));
        for bad in ["", "10", "h", "1.5h", "10w", "-1s", "99999999999999999999d"] {
            let e = duration(bad, "--older-than").unwrap_err();
            assert_eq!(e.kind, Kind::Usage, "{bad}");
            assert!(e.message.starts_with("--older-than must be a number and a unit"), "{}", e.message);
        }
    }
}
