//! Channel names: what PostgreSQL accepts, and how a name reaches `LISTEN`.
//!
//! A channel is an identifier. `LISTEN cairnq_queued` folds an unquoted name
//! to lower case while `pg_notify('Cairnq', ...)` does not, so the hub always
//! quotes: the name it listens on is byte for byte the name `pg_notify` is
//! given.

use crate::error::HubError;

/// The longest identifier PostgreSQL keeps (`NAMEDATALEN - 1`); a longer one
/// is silently truncated by the server, which would make the hub listen on a
/// channel nobody notifies.
pub const MAX_CHANNEL_BYTES: usize = 63;

/// Checks one channel name: non-empty, at most [`MAX_CHANNEL_BYTES`] bytes,
/// no NUL byte.
pub(crate) fn validate(channel: &str) -> Result<(), HubError> {
    let why = if channel.is_empty() {
        "it is empty"
    } else if channel.len() > MAX_CHANNEL_BYTES {
        "it is longer than 63 bytes, and PostgreSQL would truncate it"
    } else if channel.contains('\0') {
        "it contains a NUL byte"
    } else {
        return Ok(());
    };
    Err(HubError::InvalidChannel { channel: channel.to_owned(), reason: why })
}

/// Checks every channel and removes repeats, keeping the first order. An
/// empty set is refused: a hub with nothing to listen to has no use.
pub(crate) fn validate_all<I, S>(channels: I) -> Result<Vec<String>, HubError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let mut out: Vec<String> = Vec::new();
    for channel in channels {
        let channel = channel.as_ref();
        validate(channel)?;
        if !out.iter().any(|c| c == channel) {
            out.push(channel.to_owned());
        }
    }
    if out.is_empty() {
        return Err(HubError::NoChannels);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listen_script_names_each_channel_once() {
        let channels = validate_all(["b", "a\"x", "b"]).unwrap();
        assert_eq!(channels, ["b", "a\"x"]);
        let script = waymark_protocol::listener::listen_script(&channels);
        assert_eq!(script, "listen \"b\"; listen \"a\"\"x\";");
    }

    #[test]
    fn bad_channels_are_refused_by_name() {
        let long = "x".repeat(64);
        for (bad, why) in [("", "empty"), (long.as_str(), "63 bytes"), ("a\0b", "NUL")] {
            let err = validate_all(["ok", bad]).unwrap_err();
            let text = err.to_string();
            assert!(text.contains(&format!("{bad:?}")) && text.contains(why), "{text}");
        }
        assert!(validate(&"x".repeat(63)).is_ok());
        // 63 bytes, fewer characters: the limit is in bytes.
        assert!(validate(&"é".repeat(32)).is_err());
        assert!(matches!(validate_all(Vec::<String>::new()), Err(HubError::NoChannels)));
    }
}
