//! BurstGPT (HPMLL/BurstGPT): CSV
//! `Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type`, v3 adding
//! `Session ID` (and `Elapsed time`).
//!
//! `Timestamp` is seconds from midnight of the trace's first day (an integer or a decimal).
//! A row with 0 response tokens is a failed request: it stays in the trace as a failure
//! (`outcome = upstream_error`, with the reason in `error`), with its request tokens, so row
//! counts and token sums equal the source's and a replay still sends it. `Total tokens` must
//! equal request + response tokens. `Model` (`ChatGPT`, `GPT-4`) becomes the model column;
//! `Log Type` `Conversation log` rows go to the chat endpoint, `API log` rows to completions.
//! `Session ID` becomes `session_id`. `Elapsed time` is not mapped (its definition is not
//! documented precisely enough to be a latency).

use std::path::Path;

use trace_format::{Outcome, Result};

use crate::out::Out;
use crate::rows::{csv_records, seconds_to_us};

/// The error text of a failed (0 response tokens) row.
pub const FAILED: &str = "BurstGPT: 0 response tokens (failed request)";

struct Cols {
    ts: usize,
    model: usize,
    req: usize,
    resp: usize,
    total: Option<usize>,
    log_type: Option<usize>,
    session: Option<usize>,
}

/// Reads a BurstGPT CSV.
pub(crate) fn import(path: &Path, id_prefix: &str, out: &mut Out<'_>) -> Result<()> {
    csv_records(
        path,
        out,
        |h| {
            Ok(Cols {
                ts: h.require("Timestamp")?,
                model: h.require("Model")?,
                req: h.require("Request tokens")?,
                resp: h.require("Response tokens")?,
                total: h.find("Total tokens"),
                log_type: h.find("Log Type"),
                session: h.find("Session ID"),
            })
        },
        |row, c| {
            let (f, at) = (&row.fields, row.at);
            let arrival = seconds_to_us(&f[c.ts]).ok_or_else(|| {
                at.bad(format!(
                    "Timestamp {:?} is not a non-negative number of seconds",
                    f[c.ts]
                ))
            })?;
            let req = row.count("Request tokens", c.req)?;
            let resp = row.count("Response tokens", c.resp)?;
            if let Some(t) = c.total {
                let total = row.count("Total tokens", t)?;
                if total != req + resp {
                    return Err(at.bad(format!(
                        "Total tokens {total} != Request tokens {req} + Response tokens {resp}"
                    )));
                }
            }
            let endpoint = match c.log_type.map(|i| f[i].trim().to_ascii_lowercase()) {
                Some(t) if t.starts_with("conversation") => "/v1/chat/completions",
                Some(t) if t.starts_with("api") || t.is_empty() => "/v1/completions",
                None => "/v1/chat/completions",
                Some(t) => {
                    return Err(at.bad(format!(
                        "Log Type {t:?}: expected \"Conversation log\" or \"API log\""
                    )))
                }
            };
            let mut r = at.record(id_prefix, arrival, endpoint, req, resp);
            let model = f[c.model].trim();
            r.model = (!model.is_empty()).then(|| model.to_string());
            if resp == 0 {
                r.outcome = Outcome::UpstreamError;
                r.error = Some(FAILED.to_string());
            }
            if let Some(s) = c.session {
                let s = f[s].trim();
                r.session_id = (!s.is_empty()).then(|| s.to_string());
            }
            Ok(r)
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn import(
        p: &std::path::Path,
        prefix: &str,
    ) -> trace_format::Result<Vec<trace_format::TraceRecord>> {
        crate::read_as(crate::Format::BurstGpt, p, prefix)
    }
    use crate::{import_file, Format, ImportOptions};

    #[test]
    fn v1_and_v3_rows_with_failures_and_sessions() {
        let dir = tempfile::tempdir().unwrap();
        let v1 = dir.path().join("BurstGPT_1.csv");
        std::fs::write(
            &v1,
            "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n\
             5,ChatGPT,472,18,490,Conversation log\n\
             45,ChatGPT,1087,0,1087,Conversation log\n\
             118.5,GPT-4,417,276,693,API log\n",
        )
        .unwrap();
        let (rows, stats) = import_file(&v1, &ImportOptions::default(), "b").unwrap();
        assert_eq!(stats.format, Format::BurstGpt);
        assert_eq!(
            (
                stats.rows,
                stats.prompt_tokens,
                stats.output_tokens,
                stats.failures
            ),
            (3, 1976, 294, 1)
        );
        assert_eq!(rows[1].outcome, Outcome::UpstreamError);
        assert_eq!(rows[1].output_tokens, Some(0));
        assert_eq!(rows[2].arrival_time_us, 118_500_000);
        assert_eq!(
            (rows[2].model.as_deref(), rows[2].endpoint.as_str()),
            (Some("GPT-4"), "/v1/completions")
        );
        assert_eq!(stats.span_us(), 113_500_000);

        let v3 = dir.path().join("BurstGPT_v3.csv");
        std::fs::write(
            &v3,
            "Timestamp,Session ID,Model,Request tokens,Response tokens,Total tokens,Log Type,Elapsed time\n\
             0.25,s-1,ChatGPT,10,5,15,Conversation log,1.5\n\
             3,s-1,ChatGPT,30,6,36,Conversation log,2\n",
        )
        .unwrap();
        let (rows, _) = import_file(&v3, &ImportOptions::default(), "b").unwrap();
        assert_eq!(
            rows.iter()
                .map(|r| r.session_id.as_deref())
                .collect::<Vec<_>>(),
            vec![Some("s-1"); 2]
        );

        std::fs::write(
            &v1,
            "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n5,ChatGPT,472,18,491,Conversation log\n",
        )
        .unwrap();
        let e = import(&v1, "b").unwrap_err().to_string();
        assert!(
            e.contains("BurstGPT_1.csv:2") && e.contains("Total tokens"),
            "{e}"
        );
    }
}
