//! What a LISTEN session sends (`waymark-notify`'s statements). They go to
//! PostgreSQL as written, on a session of their own with positional
//! parameters, not through the store's `:name` pipeline; each file's
//! leading comment lines are left out.

const HEALTH_CHECK: &str = include_str!("../protocol-sql/listener/health_check.sql");
const UNLISTEN_ALL: &str = include_str!("../protocol-sql/listener/unlisten_all.sql");
const LEADER_LOCK: &str = include_str!("../protocol-sql/listener/leader_lock.sql");
const LISTEN: &str = include_str!("../protocol-sql/listener/listen.sql");
const PROBE_NOTIFY: &str = include_str!("../protocol-sql/listener/probe_notify.sql");

/// The statement of a file, without its leading `--` comment lines.
fn body(file: &'static str) -> &'static str {
    let mut rest = file;
    while rest.starts_with("--") {
        rest = rest.split_once('\n').map_or("", |(_, after)| after);
    }
    rest.trim()
}

/// `select 1`: the health check of a listening session.
pub fn health_check() -> &'static str {
    body(HEALTH_CHECK)
}

/// `unlisten *`, sent before a listening session closes.
pub fn unlisten_all() -> &'static str {
    body(UNLISTEN_ALL)
}

/// `pg_try_advisory_lock($1)` with `$1 int8`, the leader key.
pub fn leader_lock() -> &'static str {
    body(LEADER_LOCK)
}

/// `pg_notify($1, $2)` with `$1 text` the channel and `$2 text` the payload.
pub fn probe_notify() -> &'static str {
    body(PROBE_NOTIFY)
}

/// `name` as a quoted identifier: in double quotes, an embedded `"` doubled.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// One script that listens on every channel (one round trip), each name
/// quoted.
pub fn listen_script<S: AsRef<str>>(channels: &[S]) -> String {
    let template = body(LISTEN);
    channels
        .iter()
        .map(|c| template.replace("{channel}", &quote_ident(c.as_ref())))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_leave_the_comments_out() {
        assert_eq!(health_check(), "select 1");
        assert_eq!(unlisten_all(), "unlisten *");
        assert_eq!(leader_lock(), "select pg_try_advisory_lock($1)");
        assert_eq!(probe_notify(), "select pg_notify($1, $2)");
    }

    #[test]
    fn identifiers_are_quoted_with_embedded_quotes_doubled() {
        assert_eq!(quote_ident("cairnq_queued"), "\"cairnq_queued\"");
        assert_eq!(quote_ident("Mixed Case"), "\"Mixed Case\"");
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
        assert_eq!(quote_ident("\"; drop table x; --"), "\"\"\"; drop table x; --\"");
    }

    #[test]
    fn one_script_listens_on_every_channel() {
        assert_eq!(listen_script(&["b", "a\"x"]), "listen \"b\"; listen \"a\"\"x\";");
    }
}
