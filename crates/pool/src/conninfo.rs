//! The parts of a connection string that tokio-postgres does not read:
//! `sslmode=verify-ca|verify-full` and `sslrootcert` (libpq's names), taken
//! out before the rest is parsed, and the `-pooler.` host convention that
//! names the direct host behind a pooler.
//!
//! Both forms are understood: `postgres://...?k=v&k=v` and `k=v k='v'`.

/// A connection string that can give up some of its parameters.
#[derive(Debug, Clone)]
pub(crate) struct ConnInfo {
    text: String,
}

/// One `key=value` token of the key/value form, by byte range.
struct Token {
    start: usize,
    end: usize,
    key: String,
    value: String,
    value_start: usize,
}

impl ConnInfo {
    pub(crate) fn new(text: &str) -> Self {
        ConnInfo { text: text.trim().to_owned() }
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.text
    }

    fn is_url(&self) -> bool {
        self.text.starts_with("postgres://") || self.text.starts_with("postgresql://")
    }

    /// Removes `key` and returns its last value.
    pub(crate) fn take(&mut self, key: &str) -> Option<String> {
        if self.is_url() {
            self.take_from_query(key)
        } else {
            self.take_from_pairs(key)
        }
    }

    fn take_from_query(&mut self, key: &str) -> Option<String> {
        let (base, query) = self.text.split_once('?')?;
        let mut found = None;
        let kept: Vec<&str> = query
            .split('&')
            .filter(|pair| {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                if k == key {
                    found = Some(percent_decode(v));
                    false
                } else {
                    true
                }
            })
            .collect();
        found.as_ref()?;
        self.text = if kept.is_empty() { base.to_owned() } else { format!("{base}?{}", kept.join("&")) };
        found
    }

    fn take_from_pairs(&mut self, key: &str) -> Option<String> {
        let tokens = pair_tokens(&self.text);
        let mut found = None;
        let mut text = String::with_capacity(self.text.len());
        let mut last = 0;
        for t in tokens.iter().filter(|t| t.key == key) {
            text.push_str(&self.text[last..t.start]);
            last = t.end;
            found = Some(t.value.clone());
        }
        found.as_ref()?;
        text.push_str(&self.text[last..]);
        self.text = text.split_whitespace().collect::<Vec<_>>().join(" ");
        found
    }

    /// The same string with `-pooler.` taken out of each host name, when a
    /// host has it (the convention of poolers such as Neon's and Supabase's
    /// for the pooled endpoint beside the direct one).
    pub(crate) fn without_pooler_host(&self) -> Option<String> {
        const MARK: &str = "-pooler.";
        if self.is_url() {
            let scheme_end = self.text.find("://")? + 3;
            let rest = &self.text[scheme_end..];
            let authority_end = rest.find(['/', '?']).map_or(self.text.len(), |i| scheme_end + i);
            let host_start =
                self.text[scheme_end..authority_end].rfind('@').map_or(scheme_end, |i| scheme_end + i + 1);
            let hosts = &self.text[host_start..authority_end];
            if !hosts.contains(MARK) {
                return None;
            }
            Some(format!(
                "{}{}{}",
                &self.text[..host_start],
                hosts.replace(MARK, "."),
                &self.text[authority_end..]
            ))
        } else {
            let token =
                pair_tokens(&self.text).into_iter().find(|t| t.key == "host" && t.value.contains(MARK))?;
            let value = &self.text[token.value_start..token.end];
            Some(format!(
                "{}{}{}",
                &self.text[..token.value_start],
                value.replace(MARK, "."),
                &self.text[token.end..]
            ))
        }
    }
}

/// The `key=value` tokens of libpq's key/value form; values may be quoted
/// with `'` and use `\` escapes. A token that does not parse ends the scan
/// (tokio-postgres reports it when it parses the rest).
fn pair_tokens(text: &str) -> Vec<Token> {
    let bytes = text.as_bytes();
    let mut tokens = Vec::new();
    let mut i = 0;
    loop {
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        if i >= bytes.len() {
            return tokens;
        }
        let start = i;
        while i < bytes.len() && bytes[i] != b'=' && !bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        let key = text[start..i].to_owned();
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        if i >= bytes.len() || bytes[i] != b'=' {
            return tokens;
        }
        i += 1;
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        let value_start = i;
        let mut value = String::new();
        if i < bytes.len() && bytes[i] == b'\'' {
            i += 1;
            let mut closed = false;
            while i < bytes.len() {
                match bytes[i] {
                    b'\\' if i + 1 < bytes.len() => {
                        value.push(bytes[i + 1] as char);
                        i += 2;
                    }
                    b'\'' => {
                        i += 1;
                        closed = true;
                        break;
                    }
                    _ => {
                        let ch = text[i..].chars().next().expect("in bounds");
                        value.push(ch);
                        i += ch.len_utf8();
                    }
                }
            }
            if !closed {
                return tokens;
            }
        } else {
            while i < bytes.len() && !bytes[i].is_ascii_whitespace() {
                i += 1;
            }
            value.push_str(&text[value_start..i]);
        }
        tokens.push(Token { start, end: i, key, value, value_start });
    }
}

/// Decodes `%XX` escapes (and `+` is left alone, as libpq does).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            if let Some(b) = s.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_a_query_parameter_and_keeps_the_rest() {
        let mut c = ConnInfo::new(
            "postgres://u@h:5432/db?sslmode=verify-full&application_name=x&sslrootcert=%2Ftmp%2Fca.pem",
        );
        assert_eq!(c.take("sslmode").as_deref(), Some("verify-full"));
        assert_eq!(c.take("sslrootcert").as_deref(), Some("/tmp/ca.pem"));
        assert_eq!(c.as_str(), "postgres://u@h:5432/db?application_name=x");
        assert_eq!(c.take("sslmode"), None);
        let mut only = ConnInfo::new("postgresql://h/db?sslmode=require");
        assert_eq!(only.take("sslmode").as_deref(), Some("require"));
        assert_eq!(only.as_str(), "postgresql://h/db");
    }

    #[test]
    fn takes_a_key_value_pair_quoted_or_not() {
        let mut c =
            ConnInfo::new("host=h sslrootcert='/path with space/ca.pem' dbname=db sslmode = verify-ca");
        assert_eq!(c.take("sslmode").as_deref(), Some("verify-ca"));
        assert_eq!(c.take("sslrootcert").as_deref(), Some("/path with space/ca.pem"));
        assert_eq!(c.as_str(), "host=h dbname=db");
    }

    #[test]
    fn names_the_direct_host_behind_a_pooler() {
        let c = ConnInfo::new("postgres://u:p@ep-cool-1-pooler.eu.example.tech/db?sslmode=require");
        assert_eq!(
            c.without_pooler_host().as_deref(),
            Some("postgres://u:p@ep-cool-1.eu.example.tech/db?sslmode=require")
        );
        let kv = ConnInfo::new("user=u host=ep-1-pooler.example.tech dbname=db");
        assert_eq!(kv.without_pooler_host().as_deref(), Some("user=u host=ep-1.example.tech dbname=db"));
        assert_eq!(ConnInfo::new("postgres://u@db.example.com/app").without_pooler_host(), None);
        // A password that happens to hold the mark is not a host.
        assert_eq!(ConnInfo::new("postgres://u:x-pooler.y@db/app").without_pooler_host(), None);
    }

    #[test]
    fn percent_escapes_decode() {
        assert_eq!(percent_decode("a%20b%zz%2"), "a b%zz%2");
    }
}
