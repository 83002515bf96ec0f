//! Refusals of the server's that pass with time: which the pool retries
//! for a statement safe to repeat, and which end the session.

use waymark_store::ExecError;

/// Whether a statement safe to repeat is retried by the pool (after its
/// backoff) when the server refused it with `err`: a serialization
/// failure, a deadlock, a lock not available, or a read-only server
/// (25006, as in a failover: the session is not kept, so the retry takes a
/// new one, which may reach the new primary). The other refusals that pass
/// (disk full, out of memory, a statement cancelled;
/// [`waymark_store::sqlstate_passes`]) seldom pass within a backoff: they
/// surface, and callers that can wait longer read them as passing
/// (`waymark_store::Error::is_transient`). A statement not safe to repeat
/// is never retried after it was sent, whatever the refusal.
pub fn retried_refusal(err: &ExecError) -> bool {
    matches!(err.sqlstate(), Some("40001" | "40P01" | "55P03" | "25006"))
}

/// Whether the session that got `err` is dropped rather than used again:
/// one that found the server read-only (25006). After a failover its
/// server is a standby, or a demoted primary, for good.
pub fn ends_session(err: &ExecError) -> bool {
    err.sqlstate() == Some("25006")
}

#[cfg(test)]
mod tests {
    use waymark_store::ExecErrorKind;

    use super::*;

    #[test]
    fn refusals_the_pool_retries_and_sessions_it_drops() {
        let refused = |code: &str| ExecError::new(ExecErrorKind::Query, "refused").with_sqlstate(code);
        for code in ["40001", "40P01", "55P03", "25006"] {
            assert!(retried_refusal(&refused(code)), "{code}");
            assert!(waymark_store::sqlstate_passes(code), "{code}");
        }
        for code in ["53100", "53200", "57014"] {
            assert!(!retried_refusal(&refused(code)), "{code} surfaces at once");
            assert!(waymark_store::sqlstate_passes(code), "{code} passes for a caller that waits");
        }
        assert!(!retried_refusal(&refused("23505")));
        assert!(ends_session(&refused("25006")));
        assert!(!ends_session(&refused("40001")));
    }
}
