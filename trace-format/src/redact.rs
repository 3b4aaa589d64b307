//! The one redaction pass: credentials are replaced by `***` in everything llmreplay writes.
//!
//! Capture never writes request headers, but a credential still reaches the output in text:
//! an upstream that echoes the key in its 401 error (the `error` column), a request body kept
//! with `--record-bodies full` that carries an `api_key` field (the `body` column), a URL
//! with a key in its query or userinfo, the command line in the file metadata. Every trace
//! and results file goes through [`redact_record`] (the writer calls it for the journal and
//! for every Parquet batch), replay's error texts go through [`redact_text`] before they are
//! reported, and the command line through [`redact_args`].
//!
//! What is replaced:
//! - the value of a field, header or parameter named like a credential ([`is_secret_name`]):
//!   `Authorization: Bearer …`, `X-Api-Key: …`, `"api_key": "…"`, `?key=…`, `password=…`;
//! - the token after `Bearer`;
//! - provider-style keys anywhere in text: `sk-…`, `sk_…`, `hf_…`, `gsk_…`, `xai-…`,
//!   `ghp_…`, `github_pat_…`, `AIza…` (the prefix is kept: `sk-***`);
//! - the userinfo of a URL (`https://user:pass@host` → `https://***@host`).
//!
//! In a JSON body only values change: the document stays valid JSON with the same keys in the
//! same order, a credential-named member's scalar values (also inside its arrays and objects)
//! become the string `"***"`, and every other string value has the text rules applied.
//! Redaction is idempotent: redacting redacted output changes nothing.

use std::borrow::Cow;

use crate::schema::TraceRecord;

/// What a secret is replaced with.
pub const MASK: &str = "***";

/// Names (compared without case, `-`, `_`, `.` or spaces) whose value is a credential.
const EXACT: [&str; 8] = [
    "key",
    "pwd",
    "pass",
    "sig",
    "signature",
    "secret",
    "cookie",
    "setcookie",
];
/// Name endings whose value is a credential.
const SUFFIXES: [&str; 14] = [
    "apikey",
    "accesskey",
    "secretkey",
    "privatekey",
    "subscriptionkey",
    "sessionkey",
    "masterkey",
    "authkey",
    "token",
    "secret",
    "password",
    "passwd",
    "cookie",
    "credentials",
];
/// Key prefixes recognised anywhere in text, with the least number of characters after the
/// prefix for a word to count as a key.
const KEY_PREFIXES: [(&str, usize); 9] = [
    ("sk-", 6),
    ("sk_", 6),
    ("hf_", 16),
    ("gsk_", 16),
    ("xai-", 16),
    ("ghp_", 16),
    ("gho_", 16),
    ("github_pat_", 16),
    ("AIza", 30),
];

/// Whether a field, header or parameter of this name holds a credential: `authorization`,
/// `proxy-authorization`, `cookie`, `x-api-key`, `api_key`, `apiKey`, `access_token`,
/// `client_secret`, `password`, `key`, … — not `max_tokens` (a count), `author`.
pub fn is_secret_name(name: &str) -> bool {
    let n: String = name
        .chars()
        .filter(|c| !matches!(c, '-' | '_' | '.' | ' '))
        .flat_map(char::to_lowercase)
        .collect();
    if n.is_empty() {
        return false;
    }
    if EXACT.contains(&n.as_str()) || SUFFIXES.iter().any(|s| n.ends_with(s)) {
        return true;
    }
    // `auth`, `x-auth`, `authorization`, `proxy-authorization`, `auth_header`; not `author`.
    n.contains("auth") && (!n.contains("author") || n.contains("authoriz"))
}

fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}

/// Characters of a bearer token (RFC 6750 `b64token`).
fn is_token(b: u8) -> bool {
    is_word(b) || matches!(b, b'.' | b'~' | b'+' | b'/' | b'=')
}

fn skip_blanks(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && (b[i] == b' ' || b[i] == b'\t') {
        i += 1;
    }
    i
}

/// Replaces every credential in free text (error messages, URLs, log lines) with `***`.
/// Borrows when there is nothing to replace.
pub fn redact_text(s: &str) -> Cow<'_, str> {
    let b = s.as_bytes();
    // (start, end, replacement) of each span to replace, in order, not overlapping.
    let mut edits: Vec<(usize, usize, Cow<'static, str>)> = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"://") {
            if let Some((lo, hi)) = userinfo(b, i + 3) {
                edits.push((lo, hi, MASK.into()));
                i = hi;
            } else {
                i += 3;
            }
            continue;
        }
        if !is_word(b[i]) || (i > 0 && is_word(b[i - 1])) {
            i += 1;
            continue;
        }
        let start = i;
        let mut end = i;
        while end < b.len() && is_word(b[end]) {
            end += 1;
        }
        let word = &s[start..end];
        if let Some(prefix) = key_prefix(word) {
            if &s[start + prefix.len()..end] != MASK {
                edits.push((start + prefix.len(), end, MASK.into()));
            }
            i = end;
            continue;
        }
        if word.eq_ignore_ascii_case("bearer") {
            let t = skip_blanks(b, end);
            let mut te = t;
            while te < b.len() && is_token(b[te]) {
                te += 1;
            }
            // "Bearer token", "Bearer realm": a plain lowercase word is prose, not a token.
            if te > t && t > end && !b[t..te].iter().all(u8::is_ascii_lowercase) {
                edits.push((t, te, MASK.into()));
                i = te;
                continue;
            }
        }
        if is_secret_name(word) {
            if let Some((lo, hi)) = secret_value(b, start, end) {
                if &s[lo..hi] != MASK {
                    edits.push((lo, hi, MASK.into()));
                }
                i = hi.max(end);
                continue;
            }
        }
        i = end;
    }
    apply(s, edits)
}

/// The key prefix `word` starts with, when the word is long enough to be a key.
fn key_prefix(word: &str) -> Option<&'static str> {
    KEY_PREFIXES
        .iter()
        .find(|(p, min)| word.starts_with(p) && word.len() >= p.len() + min)
        .map(|(p, _)| *p)
}

/// The userinfo of a URL whose authority starts at `from` (just after `://`): the span
/// before the last `@` of the authority.
fn userinfo(b: &[u8], from: usize) -> Option<(usize, usize)> {
    let mut at = None;
    let mut i = from;
    while i < b.len() && !b"/?#\"'<> \t\r\n\\".contains(&b[i]) {
        if b[i] == b'@' {
            at = Some(i);
        }
        i += 1;
    }
    let at = at?;
    (at > from && &b[from..at] != MASK.as_bytes()).then_some((from, at))
}

/// The value after a credential name spanning `start..end`: `name: value` (to the end of
/// the line), `name=value` (to the next separator), `"name": "value"` (the string's
/// content). `None` when no value follows.
fn secret_value(b: &[u8], start: usize, end: usize) -> Option<(usize, usize)> {
    let mut j = end;
    // A quoted name: "api_key": … or 'api_key': …
    if start > 0 && matches!(b[start - 1], b'"' | b'\'') && b.get(j) == Some(&b[start - 1]) {
        j += 1;
    }
    j = skip_blanks(b, j);
    let sep = *b.get(j)?;
    if sep != b':' && sep != b'=' {
        return None;
    }
    j = skip_blanks(b, j + 1);
    let first = *b.get(j)?;
    if first == b'"' || first == b'\'' {
        // A quoted value: its content, escapes honoured; unterminated, to the end of the line.
        let lo = j + 1;
        let mut k = lo;
        while k < b.len() && b[k] != first && b[k] != b'\n' {
            k += if b[k] == b'\\' { 2 } else { 1 };
        }
        let hi = k.min(b.len());
        return (hi > lo).then_some((lo, hi));
    }
    if matches!(first, b'{' | b'[') {
        return None;
    }
    let stop: &[u8] = if sep == b':' {
        b"\r\n\"'\\,}]<>"
    } else {
        b" \t\r\n\"'\\,;&}])<>#"
    };
    let mut k = j;
    while k < b.len() && !stop.contains(&b[k]) {
        k += 1;
    }
    // Trailing blanks of a header value stay.
    while k > j && (b[k - 1] == b' ' || b[k - 1] == b'\t') {
        k -= 1;
    }
    (k > j).then_some((j, k))
}

fn apply<'a>(s: &'a str, edits: Vec<(usize, usize, Cow<'static, str>)>) -> Cow<'a, str> {
    if edits.is_empty() {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len());
    let mut at = 0;
    for (lo, hi, with) in edits {
        out.push_str(&s[at..lo]);
        out.push_str(&with);
        at = hi;
    }
    out.push_str(&s[at..]);
    Cow::Owned(out)
}

/// Redacts a stored request body: as JSON when it is JSON (see the module documentation; the
/// result is valid JSON with the same keys), as text otherwise.
pub fn redact_json(s: &str) -> Cow<'_, str> {
    let mut w = JsonWalk {
        s,
        b: s.as_bytes(),
        i: 0,
        edits: Vec::new(),
    };
    let whole = w.value(0, false).is_some() && {
        w.ws();
        w.i == w.b.len()
    };
    if !whole {
        return redact_text(s);
    }
    let edits = w
        .edits
        .into_iter()
        .map(|(lo, hi, with)| (lo, hi, Cow::Owned(with)))
        .collect();
    apply(s, edits)
}

/// Nesting deeper than this is not walked (the body is redacted as text instead).
const MAX_DEPTH: usize = 128;

/// A JSON walker recording the replacement of each value to redact.
struct JsonWalk<'a> {
    s: &'a str,
    b: &'a [u8],
    i: usize,
    edits: Vec<(usize, usize, String)>,
}

impl JsonWalk<'_> {
    fn ws(&mut self) {
        while self.i < self.b.len() && matches!(self.b[self.i], b' ' | b'\t' | b'\r' | b'\n') {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        self.ws();
        (self.b.get(self.i) == Some(&c)).then(|| self.i += 1)
    }

    /// A string at `i`: its span with the quotes and its decoded content.
    fn string(&mut self) -> Option<(usize, usize, Cow<'_, str>)> {
        self.ws();
        if self.b.get(self.i) != Some(&b'"') {
            return None;
        }
        let lo = self.i;
        let mut k = lo + 1;
        let mut escaped = false;
        loop {
            match *self.b.get(k)? {
                b'"' => break,
                b'\\' => {
                    escaped = true;
                    k += 2;
                }
                c if c < 0x20 => return None,
                _ => k += 1,
            }
        }
        let hi = k + 1;
        self.i = hi;
        let raw = &self.s[lo..hi];
        let text = if escaped {
            Cow::Owned(serde_json::from_str::<String>(raw).ok()?)
        } else {
            Cow::Borrowed(&raw[1..raw.len() - 1])
        };
        Some((lo, hi, text))
    }

    /// Walks one value; `secret` when it belongs to a credential-named member.
    fn value(&mut self, depth: usize, secret: bool) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.ws();
        match *self.b.get(self.i)? {
            b'{' => {
                self.i += 1;
                if self.eat(b'}').is_some() {
                    return Some(());
                }
                loop {
                    let (_, _, key) = self.string()?;
                    let member_secret = secret || is_secret_name(&key);
                    self.eat(b':')?;
                    self.value(depth + 1, member_secret)?;
                    if self.eat(b',').is_none() {
                        return self.eat(b'}');
                    }
                }
            }
            b'[' => {
                self.i += 1;
                if self.eat(b']').is_some() {
                    return Some(());
                }
                loop {
                    self.value(depth + 1, secret)?;
                    if self.eat(b',').is_none() {
                        return self.eat(b']');
                    }
                }
            }
            b'"' => {
                let (lo, hi, text) = self.string()?;
                let with = if secret {
                    (text != MASK).then(|| format!("\"{MASK}\""))
                } else {
                    match redact_text(&text) {
                        Cow::Borrowed(_) => None,
                        Cow::Owned(r) => Some(serde_json::to_string(&r).ok()?),
                    }
                };
                if let Some(with) = with {
                    self.edits.push((lo, hi, with));
                }
                Some(())
            }
            _ => {
                let lo = self.i;
                while self.i < self.b.len()
                    && (self.b[self.i].is_ascii_alphanumeric() || b"+-.".contains(&self.b[self.i]))
                {
                    self.i += 1;
                }
                let tok = &self.s[lo..self.i];
                match tok {
                    "null" => {}
                    "true" | "false" => {
                        if secret {
                            self.edits.push((lo, self.i, format!("\"{MASK}\"")));
                        }
                    }
                    _ => {
                        tok.parse::<f64>().ok()?;
                        if secret {
                            self.edits.push((lo, self.i, format!("\"{MASK}\"")));
                        }
                    }
                }
                Some(())
            }
        }
    }
}

/// Redacts the text columns of a record that can carry a credential: `error`, `body` (as
/// JSON), `endpoint` (a query string) and `target` (a URL).
pub fn redact_record(r: &mut TraceRecord) {
    fn set(field: &mut String, f: fn(&str) -> Cow<'_, str>) {
        if let Cow::Owned(v) = f(field) {
            *field = v;
        }
    }
    if let Some(e) = r.error.as_mut() {
        set(e, redact_text);
    }
    if let Some(b) = r.body.as_mut() {
        set(b, redact_json);
    }
    set(&mut r.endpoint, redact_text);
    if let Some(t) = r.target.as_mut() {
        set(t, redact_text);
    }
    for names in [r.tool_names.as_mut(), r.tool_call_names.as_mut()]
        .into_iter()
        .flatten()
    {
        for n in names {
            set(n, redact_text);
        }
    }
}

/// The arguments of a command line with every secret replaced by `***`: the value of
/// `--api-key`, the value of a `--header NAME:VALUE` whose name is a credential
/// ([`is_secret_name`]), and whatever [`redact_text`] finds in any other argument (a key in a
/// URL or a `--metadata` value). The command line is written into the console, the JSON
/// result, the Parquet metadata and the report.
pub fn redact_args(args: impl IntoIterator<Item = String>) -> Vec<String> {
    fn header(kv: &str) -> String {
        match kv.split_once(':') {
            Some((k, _)) if is_secret_name(k) => format!("{k}:{MASK}"),
            _ => redact_text(kv).into_owned(),
        }
    }
    fn mask(_: &str) -> String {
        MASK.into()
    }
    let mut out = Vec::new();
    let mut pending: Option<fn(&str) -> String> = None;
    for a in args {
        if let Some(f) = pending.take() {
            out.push(f(&a));
            continue;
        }
        if a == "--api-key" {
            pending = Some(mask);
            out.push(a);
        } else if a.starts_with("--api-key=") {
            out.push(format!("--api-key={MASK}"));
        } else if a == "--header" {
            pending = Some(header);
            out.push(a);
        } else if let Some(kv) = a.strip_prefix("--header=") {
            out.push(format!("--header={}", header(kv)));
        } else {
            out.push(redact_text(&a).into_owned());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_names() {
        for n in [
            "Authorization",
            "proxy-authorization",
            "X-Api-Key",
            "api-key",
            "api_key",
            "apiKey",
            "x-goog-api-key",
            "Ocp-Apim-Subscription-Key",
            "access_token",
            "refresh_token",
            "client_secret",
            "password",
            "key",
            "Cookie",
            "set-cookie",
            "X-Auth",
            "aws_secret_access_key",
        ] {
            assert!(is_secret_name(n), "{n}");
        }
        for n in [
            "max_tokens",
            "prompt_tokens",
            "max_completion_tokens",
            "skip_special_tokens",
            "author",
            "model",
            "x-tenant",
            "content-type",
            "keys_per_page",
            "",
        ] {
            assert!(!is_secret_name(n), "{n}");
        }
    }

    #[test]
    fn text_keeps_no_key_and_everything_else() {
        let cases = [
            (
                "upstream 401: Incorrect API key provided: sk-proj-abcdEFGH1234. You can find it",
                "upstream 401: Incorrect API key provided: sk-***. You can find it",
            ),
            (
                r#"{"error":{"message":"Invalid key sk-live-123456","type":"invalid_request_error","code":"invalid_api_key"}}"#,
                r#"{"error":{"message":"Invalid key sk-***","type":"invalid_request_error","code":"invalid_api_key"}}"#,
            ),
            (
                "received header Authorization: Bearer abc.def-123\nnext line",
                "received header Authorization: ***\nnext line",
            ),
            ("X-Api-Key: k3y-v4lue", "X-Api-Key: ***"),
            ("token Bearer eyJhbGciOi.x_y.z", "token Bearer ***"),
            ("Bearer token required", "Bearer token required"),
            (
                r#"echo: {"api_key": "plain-secret", "model": "m"}"#,
                r#"echo: {"api_key": "***", "model": "m"}"#,
            ),
            (r#"'password': 'hunter2'"#, r#"'password': '***'"#),
            (
                "GET /v1/models?key=AIzaSyA-1234&alt=json failed",
                "GET /v1/models?key=***&alt=json failed",
            ),
            (
                "connect https://user:pa55@host:8443/v1 refused",
                "connect https://***@host:8443/v1 refused",
            ),
            ("hf_abcdefghijklmnopqrstuv in use", "hf_*** in use"),
            (
                "max_tokens: must be at most 4096; task-based sk-lea",
                "max_tokens: must be at most 4096; task-based sk-lea",
            ),
            ("connection reset by peer", "connection reset by peer"),
            ("unicode ☃ key=välue end", "unicode ☃ key=*** end"),
        ];
        for (input, want) in cases {
            let got = redact_text(input);
            assert_eq!(got, want, "{input}");
            // Idempotent.
            assert_eq!(redact_text(&got), got.as_ref(), "{input}");
        }
        assert!(matches!(redact_text("nothing here"), Cow::Borrowed(_)));
    }

    #[test]
    fn json_bodies_stay_valid_with_their_keys() {
        let body = r#"{"model":"m","api_key":"sk-live-SECRET1","messages":[{"role":"user","content":"my key is sk-live-SECRET2, Bearer Tok3nXYZ"}],"max_tokens":128,"extra":{"credentials":{"user":"u","pin":1234},"token":true,"apiKey":null},"n":1.5e3}"#;
        let out = redact_json(body);
        assert!(!out.contains("SECRET"), "{out}");
        assert!(!out.contains("Tok3n"), "{out}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("valid JSON");
        let orig: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["api_key"], "***");
        assert_eq!(v["model"], "m");
        assert_eq!(v["max_tokens"], 128);
        assert_eq!(v["n"], 1500.0);
        assert_eq!(v["extra"]["credentials"]["user"], "***");
        assert_eq!(v["extra"]["credentials"]["pin"], "***");
        assert_eq!(v["extra"]["token"], "***");
        assert_eq!(v["extra"]["apiKey"], serde_json::Value::Null);
        assert_eq!(v["messages"][0]["content"], "my key is sk-***, Bearer ***");
        // Same keys, same order, same bytes outside the redacted values.
        let keys =
            |v: &serde_json::Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
        assert_eq!(keys(&v), keys(&orig));
        assert!(
            out.starts_with(r#"{"model":"m","api_key":"***","messages":"#),
            "{out}"
        );
        assert_eq!(redact_json(&out), out.as_ref(), "idempotent");
        // Escapes in a secret's name and value.
        let esc = r#"{"api\u005fkey":"a\"b","p":"x\ny sk-abcdefgh"}"#;
        let v: serde_json::Value = serde_json::from_str(&redact_json(esc)).unwrap();
        assert_eq!(v["api_key"], "***");
        assert_eq!(v["p"], "x\ny sk-***");
        // Nothing to redact borrows; not JSON is redacted as text.
        assert!(matches!(
            redact_json(r#"{"a":[1,2,"x"]}"#),
            Cow::Borrowed(_)
        ));
        assert_eq!(redact_json("api_key=abc&x=1"), "api_key=***&x=1");
        let deep = "[".repeat(1000) + &"]".repeat(1000);
        assert_eq!(redact_json(&deep), deep);
    }

    #[test]
    fn records_are_redacted_in_every_text_column() {
        let mut r = TraceRecord::new("r", 0, "/v1/chat/completions?api-key=abc123");
        r.error = Some("HTTP 401: {\"error\":\"bad key sk-live-0123456789\"}".into());
        r.body = Some(r#"{"api_key":"sk-live-0123456789"}"#.into());
        r.target = Some("http://u:p@h:8000".into());
        redact_record(&mut r);
        let all = serde_json::to_string(&r).unwrap();
        assert!(
            !all.contains("0123456789") && !all.contains("abc123") && !all.contains("u:p@"),
            "{all}"
        );
        assert_eq!(r.endpoint, "/v1/chat/completions?api-key=***");
        assert_eq!(r.body.as_deref(), Some(r#"{"api_key":"***"}"#));
    }

    /// Every secret of a command line is replaced (in the console, the JSON result, the
    /// metadata, the report); other values stay as given.
    #[test]
    fn the_command_line_keeps_no_secret() {
        let args = [
            "llmreplay",
            "replay",
            "t.parquet",
            "--api-key",
            "sk-live-1",
            "--api-key=sk-live-2",
            "--header",
            "X-Api-Key:sk-live-3",
            "--header=Authorization: Bearer sk-live-4",
            "--header",
            "x-tenant:blue",
            "--header",
            "Cookie:s=sk-live-5",
            "--target",
            "http://h:8000",
            "--target",
            "http://me:sk-live-6@h:8000",
            "--metadata",
            "note=sk-live-777777",
        ]
        .map(String::from);
        let out = redact_args(args).join(" ");
        assert!(!out.contains("sk-live"), "{out}");
        assert_eq!(
            out,
            "llmreplay replay t.parquet --api-key *** --api-key=*** --header X-Api-Key:*** \
             --header=Authorization:*** --header x-tenant:blue --header Cookie:*** --target http://h:8000 \
             --target http://***@h:8000 --metadata note=sk-***"
        );
    }
}
