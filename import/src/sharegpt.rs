//! ShareGPT (e.g. `ShareGPT_V3_unfiltered_cleaned_split.json`, what `vllm bench serve
//! --dataset-name sharegpt` reads): a JSON array of `{"id", "conversations": [{"from",
//! "value"}, ...]}`.
//!
//! As in vLLM, a conversation's first message is the prompt and its second the completion:
//! one request per conversation, with the real prompt text kept as a chat request body
//! (`messages: [{role: user, content}]`, `max_tokens` = completion tokens, streamed), so a
//! replay sends the text itself. Token counts are the content's by the chosen tokenizer
//! (`prompt_tokens_source = tokenizer`). The source has no timestamps: arrivals follow the
//! gamma process of `--request-rate`/`--burstiness`/`--seed` ([`trace_format::arrivals`]), from the
//! Unix epoch. Conversations with fewer than two messages hold no request; they are listed in
//! the import's `skipped` report, never dropped silently. A message without a string
//! `value` is an error naming the conversation.

use std::path::Path;

use serde_json::{json, Value};

use trace_format::{Error, Result, TokenSource, TraceRecord};

use crate::out::{Out, Sink};
use crate::rows::bad;
use crate::ImportOptions;

/// Endpoint of imported rows.
pub const ENDPOINT: &str = "/v1/chat/completions";

/// Reads a ShareGPT JSON file into `out` (the whole document first); the skipped
/// conversations (with why) go to its statistics.
pub(crate) fn import(
    path: &Path,
    id_prefix: &str,
    opts: &ImportOptions,
    out: &mut Out<'_>,
) -> Result<()> {
    let tok = opts.tokenizer.as_ref().ok_or_else(|| {
        Error::Invalid(format!(
            "{}: ShareGPT has text, not token counts: give --tokenizer (e.g. cl100k_base or a tokenizer.json)",
            path.display()
        ))
    })?;
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let data: Value = serde_json::from_reader(std::io::BufReader::with_capacity(1 << 20, file))
        .map_err(|e| bad(path, e.line(), format!("not JSON: {e}")))?;
    let convs = data
        .as_array()
        .ok_or_else(|| bad(path, 1, "expected a JSON array of conversations"))?;
    let invalid = |i: usize, id: &str, msg: &str| {
        Error::Invalid(format!(
            "{}: conversation #{i} (id {id:?}): {msg}",
            path.display()
        ))
    };
    let mut pending = Vec::new();
    let mut skipped = Vec::new();
    for (i, c) in convs.iter().enumerate() {
        let id = c
            .get("id")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let msgs = c
            .get("conversations")
            .and_then(Value::as_array)
            .ok_or_else(|| invalid(i, &id, "no \"conversations\" array"))?;
        if msgs.len() < 2 {
            skipped.push(format!(
                "conversation #{i} (id {id:?}): {} message(s), no prompt/completion pair",
                msgs.len()
            ));
            continue;
        }
        let text = |k: usize| -> Result<&str> {
            msgs[k]
                .get("value")
                .and_then(Value::as_str)
                .ok_or_else(|| invalid(i, &id, &format!("message {k} has no string \"value\"")))
        };
        let (prompt, completion) = (text(0)?, text(1)?);
        let count = |text: &str| tok.count(text).map_err(|e| Error::Invalid(e.to_string()));
        let p = count(prompt)? as i64;
        let o = count(completion)? as i64;
        pending.push((i, id, prompt, p, o));
    }
    let offsets = trace_format::arrivals::gamma_offsets(
        pending.len(),
        opts.request_rate,
        opts.burstiness,
        opts.seed,
    )?;
    let rows: Vec<TraceRecord> = pending
        .into_iter()
        .zip(offsets)
        .map(|((i, id, prompt, p, o), off)| {
            let mut r =
                TraceRecord::new(format!("{id_prefix}:{i}"), off.as_micros() as i64, ENDPOINT);
            r.session_id = (!id.is_empty()).then_some(id);
            r.stream = true;
            r.prompt_tokens = Some(p);
            r.output_tokens = Some(o);
            r.max_tokens = Some(o.max(1));
            r.prompt_tokens_source = Some(TokenSource::Tokenizer);
            r.output_tokens_source = Some(TokenSource::Tokenizer);
            let mut body = json!({
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": o.max(1),
                "stream": true,
            });
            if let Some(m) = &opts.model {
                body["model"] = json!(m);
            }
            let body = body.to_string();
            r.request_bytes = body.len() as i64;
            r.body = Some(body);
            r
        })
        .collect();
    out.stats.skipped = skipped;
    out.push_all(rows).map(drop)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{import as import_all, Format};
    use tokenize::Tokenizer;

    #[test]
    fn conversations_become_requests_with_counted_tokens_and_gamma_arrivals() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sg.json");
        std::fs::write(
            &p,
            r#"[
  {"id": "a", "conversations": [{"from": "human", "value": "hello world"}, {"from": "gpt", "value": "hi there, friend"}]},
  {"id": "b", "conversations": [{"from": "human", "value": "only a question"}]},
  {"id": "c", "conversations": [{"from": "human", "value": "one two three four"}, {"from": "gpt", "value": "five"}, {"from": "human", "value": "six"}]}
]"#,
        )
        .unwrap();
        let tok = Arc::new(Tokenizer::load("cl100k_base").unwrap());
        let opts = ImportOptions {
            format: Format::Auto,
            tokenizer: Some(tok.clone()),
            request_rate: 10.0,
            burstiness: 1.0,
            seed: 3,
            model: Some("m".into()),
            ..Default::default()
        };
        let t = import_all(std::slice::from_ref(&p), &opts, "test").unwrap();
        let s = &t.sources[0];
        assert_eq!(
            (s.format, s.rows, s.skipped.len()),
            (Format::ShareGpt, 2, 1)
        );
        assert!(s.skipped[0].contains("\"b\""));
        let r = &t.records;
        assert_eq!(
            r[0].prompt_tokens,
            Some(tok.count("hello world").unwrap() as i64)
        );
        assert_eq!(
            r[0].output_tokens,
            Some(tok.count("hi there, friend").unwrap() as i64)
        );
        assert_eq!(r[1].prompt_tokens, Some(4));
        assert_eq!(r[0].arrival_time_us, 0);
        let offs = trace_format::arrivals::gamma_offsets(2, 10.0, 1.0, 3).unwrap();
        assert_eq!(r[1].arrival_time_us, offs[1].as_micros() as i64);
        let body: Value = serde_json::from_str(r[0].body.as_deref().unwrap()).unwrap();
        assert_eq!(body["messages"][0]["content"], "hello world");
        assert_eq!(body["model"], "m");
        assert_eq!(
            t.meta.extra.get("tokenizer").map(String::as_str),
            Some("cl100k_base")
        );

        let no_tok = ImportOptions {
            tokenizer: None,
            ..opts.clone()
        };
        assert!(import_all(std::slice::from_ref(&p), &no_tok, "t")
            .unwrap_err()
            .to_string()
            .contains("--tokenizer"));
        std::fs::write(
            &p,
            "[{\"id\": \"x\", \"conversations\": [{\"value\": 1}, {\"value\": \"a\"}]}]",
        )
        .unwrap();
        assert!(import_all(std::slice::from_ref(&p), &opts, "t")
            .unwrap_err()
            .to_string()
            .contains("conversation #0"));
        std::fs::write(&p, "[\n{\"id\": \"x\",\n oops}]").unwrap();
        assert!(import_all(&[p], &opts, "t")
            .unwrap_err()
            .to_string()
            .contains("sg.json:3"));
    }
}
