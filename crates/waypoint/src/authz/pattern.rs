//! Istio's value patterns: `*` (presence), `abc*` (prefix), `*abc` (suffix), else exact.
//!
//! The order of the checks is Istio's (`pilot/pkg/security/authz/matcher/string.go`,
//! `StringMatcherWithPrefix`): `*` first, then a leading `*` (so `*abc*` is the suffix `abc*`),
//! then a trailing `*`.

/// One value of a policy field, as Istio reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    /// The whole value equals this.
    Exact(String),
    /// The value starts with this (`abc*`).
    Prefix(String),
    /// The value ends with this (`*abc`).
    Suffix(String),
    /// `*`: any non-empty value (Istio's regex `.+`; for headers, the header is present).
    Presence,
}

/// A namespace pattern: Istio turns every `*` into `.*` anywhere in the value
/// (`srcNamespaceGenerator`), so `*` matches any run of characters, also the empty one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob(String);

impl Pattern {
    /// Reads a policy value.
    pub fn parse(value: &str) -> Self {
        if value == "*" {
            Pattern::Presence
        } else if let Some(suffix) = value.strip_prefix('*') {
            Pattern::Suffix(suffix.to_owned())
        } else if let Some(prefix) = value.strip_suffix('*') {
            Pattern::Prefix(prefix.to_owned())
        } else {
            Pattern::Exact(value.to_owned())
        }
    }

    /// Reads each of a list of policy values.
    pub fn parse_all<S: AsRef<str>>(values: &[S]) -> Vec<Self> {
        values.iter().map(|v| Self::parse(v.as_ref())).collect()
    }

    /// Case-sensitive match, as Envoy's `StringMatcher` without `ignore_case`.
    pub fn matches(&self, value: &str) -> bool {
        match self {
            Pattern::Exact(e) => value == e,
            Pattern::Prefix(p) => value.starts_with(p.as_str()),
            Pattern::Suffix(s) => value.ends_with(s.as_str()),
            Pattern::Presence => !value.is_empty(),
        }
    }

    /// ASCII case-insensitive match, as Envoy's `StringMatcher` with `ignore_case: true`.
    pub fn matches_ignore_case(&self, value: &str) -> bool {
        let v = value.as_bytes();
        match self {
            Pattern::Exact(e) => v.eq_ignore_ascii_case(e.as_bytes()),
            Pattern::Prefix(p) => v.len() >= p.len() && v[..p.len()].eq_ignore_ascii_case(p.as_bytes()),
            Pattern::Suffix(s) => {
                v.len() >= s.len() && v[v.len() - s.len()..].eq_ignore_ascii_case(s.as_bytes())
            }
            Pattern::Presence => !value.is_empty(),
        }
    }
}

impl Glob {
    /// Reads a namespace value.
    pub fn new(value: &str) -> Self {
        Glob(value.to_owned())
    }

    /// Whether `text` matches as a whole, each `*` standing for any run of characters.
    pub fn matches(&self, text: &str) -> bool {
        let (p, t) = (self.0.as_bytes(), text.as_bytes());
        let (mut pi, mut ti) = (0, 0);
        // Where the last `*` was, and the text position it now absorbs up to.
        let mut star: Option<(usize, usize)> = None;
        while ti < t.len() {
            if pi < p.len() && p[pi] == b'*' {
                star = Some((pi, ti));
                pi += 1;
            } else if pi < p.len() && p[pi] == t[ti] {
                pi += 1;
                ti += 1;
            } else if let Some((sp, st)) = star {
                pi = sp + 1;
                ti = st + 1;
                star = Some((sp, st + 1));
            } else {
                return false;
            }
        }
        p[pi..].iter().all(|&c| c == b'*')
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_follows_istios_order() {
        let cases = [
            ("*", Pattern::Presence),
            ("abc*", Pattern::Prefix("abc".into())),
            ("*abc", Pattern::Suffix("abc".into())),
            ("*abc*", Pattern::Suffix("abc*".into())),
            ("**", Pattern::Suffix("*".into())),
            ("abc", Pattern::Exact("abc".into())),
            ("", Pattern::Exact(String::new())),
        ];
        for (value, want) in cases {
            assert_eq!(Pattern::parse(value), want, "value {value:?}");
        }
    }

    #[test]
    fn matches_case_sensitive_and_insensitive() {
        // (pattern, value, case-sensitive result, case-insensitive result)
        let cases = [
            ("abc", "abc", true, true),
            ("abc", "ABC", false, true),
            ("abc", "abcd", false, false),
            ("ab*", "ABcd", false, true),
            ("ab*", "ab", true, true),
            ("ab*", "a", false, false),
            ("*.Example.com", "www.example.COM", false, true),
            ("*.example.com", "example.com", false, false),
            ("*", "x", true, true),
            ("*", "", false, false),
            ("", "", true, true),
        ];
        for (pattern, value, sensitive, insensitive) in cases {
            let p = Pattern::parse(pattern);
            assert_eq!(p.matches(value), sensitive, "{pattern:?} vs {value:?}");
            assert_eq!(p.matches_ignore_case(value), insensitive, "{pattern:?} vs {value:?} (ignore case)");
        }
    }

    #[test]
    fn glob_stars_match_any_run() {
        let cases = [
            ("default", "default", true),
            ("default", "default2", false),
            ("*", "", true),
            ("*", "anything", true),
            ("prod-*", "prod-eu", true),
            ("prod-*", "prod-", true),
            ("prod-*", "dev-eu", false),
            ("*-eu", "prod-eu", true),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "axxbyy", false),
            ("a*c", "abcbc", true),
            ("", "", true),
            ("", "x", false),
        ];
        for (glob, text, want) in cases {
            assert_eq!(Glob::new(glob).matches(text), want, "{glob:?} vs {text:?}");
        }
    }
}
