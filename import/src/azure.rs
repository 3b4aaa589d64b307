//! Azure LLM inference traces (Azure/AzurePublicDataset), 2023 and 2024: CSV with header
//! `TIMESTAMP,ContextTokens,GeneratedTokens`; and the multimodal trace of 2025
//! (`AzureLMMInferenceTrace_multimodal.csv.gz`, `AzureLMMInferenceDataset2025.md`), which adds
//! `NumImages`, the images in the request.
//!
//! `TIMESTAMP` is absolute UTC: 2023 writes 7 fractional digits without a zone
//! (`2023-11-16 18:17:03.9799600`), 2024 writes up to 6 with `+00:00`
//! (`2024-05-10 00:00:00.009930+00:00`), and fewer digits or none where trailing zeros were
//! dropped. Digits beyond the sixth (100 ns) are truncated to the µs of the trace schema;
//! any other zone offset is applied. Rows become completions requests; a file with
//! `NumImages` holds a multimodal model's requests, which are chat requests, the count in the
//! `images` column (a replay sends the text tokens: images are not synthesized).

use std::path::Path;

use trace_format::Result;

use crate::out::Out;
use crate::rows::csv_records;

/// Endpoint of imported rows.
pub const ENDPOINT: &str = "/v1/completions";
/// Endpoint of the multimodal trace's rows (images go in chat messages).
pub const MULTIMODAL_ENDPOINT: &str = "/v1/chat/completions";

/// Reads an Azure trace CSV.
pub(crate) fn import(path: &Path, id_prefix: &str, out: &mut Out<'_>) -> Result<()> {
    csv_records(
        path,
        out,
        |h| {
            Ok((
                [
                    h.require("TIMESTAMP")?,
                    h.require("ContextTokens")?,
                    h.require("GeneratedTokens")?,
                ],
                h.find("NumImages"),
            ))
        },
        |row, &([ts, ctx, gen], images)| {
            let f = &row.fields;
            let arrival = parse_timestamp(&f[ts])
                .map_err(|e| row.at.bad(format!("TIMESTAMP {:?}: {e}", f[ts])))?;
            let prompt = row.count("ContextTokens", ctx)?;
            let output = row.count("GeneratedTokens", gen)?;
            let Some(i) = images else {
                return Ok(row.at.record(id_prefix, arrival, ENDPOINT, prompt, output));
            };
            let n = row.count("NumImages", i)?;
            let mut r = row
                .at
                .record(id_prefix, arrival, MULTIMODAL_ENDPOINT, prompt, output);
            r.images = Some(
                i32::try_from(n)
                    .map_err(|_| row.at.bad(format!("NumImages {n} is out of range")))?,
            );
            Ok(r)
        },
    )
}

/// Why a timestamp does not parse: what was expected or out of range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadTimestamp(String);

impl std::fmt::Display for BadTimestamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadTimestamp {}

/// Parses `YYYY-MM-DD HH:MM:SS[.fraction][Z|±HH:MM]` (a `T` separator is accepted too) into
/// µs since the Unix epoch, UTC. Fraction digits beyond 6 are truncated.
pub fn parse_timestamp(s: &str) -> std::result::Result<i64, BadTimestamp> {
    timestamp_us(s).map_err(BadTimestamp)
}

fn timestamp_us(s: &str) -> std::result::Result<i64, String> {
    let s = s.trim();
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> std::result::Result<i64, String> {
        let part = s.get(r).ok_or("too short")?;
        if part.is_empty() || !part.bytes().all(|c| c.is_ascii_digit()) {
            return Err(format!("{part:?} is not a number"));
        }
        part.parse::<i64>().map_err(|e| e.to_string())
    };
    if b.len() < 19
        || b[4] != b'-'
        || b[7] != b'-'
        || !(b[10] == b' ' || b[10] == b'T')
        || b[13] != b':'
        || b[16] != b':'
    {
        return Err("expected YYYY-MM-DD HH:MM:SS[.ffffff][+00:00]".into());
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month)
        || day < 1
        || day > days_in_month(year, month)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return Err("date or time out of range".into());
    }
    let mut i = 19;
    let mut micros = 0i64;
    if b.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        let digits = &s[start..i];
        if digits.is_empty() {
            return Err("a '.' without fraction digits".into());
        }
        for k in 0..6 {
            micros = micros * 10 + digits.as_bytes().get(k).map_or(0, |d| i64::from(d - b'0'));
        }
    }
    let offset_s = match &s[i..] {
        "" | "Z" => 0,
        zone => {
            let zb = zone.as_bytes();
            if zb.len() != 6 || !(zb[0] == b'+' || zb[0] == b'-') || zb[3] != b':' {
                return Err(format!("zone {zone:?}: expected +HH:MM"));
            }
            let h: i64 = zone[1..3].parse().map_err(|_| format!("zone {zone:?}"))?;
            let m: i64 = zone[4..6].parse().map_err(|_| format!("zone {zone:?}"))?;
            let sign = if zb[0] == b'-' { -1 } else { 1 };
            sign * (h * 3600 + m * 60)
        }
    };
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second - offset_s;
    Ok(secs * 1_000_000 + micros)
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        _ if is_leap(y) => 29,
        _ => 28,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn import(
        p: &std::path::Path,
        prefix: &str,
    ) -> trace_format::Result<Vec<trace_format::TraceRecord>> {
        crate::read_as(crate::Format::Azure, p, prefix)
    }
    use crate::{import_file, test_shared_data, Format, ImportOptions};

    /// The multimodal trace of 2025 (its dataset card's schema: `TIMESTAMP`, `NumImages`,
    /// `ContextTokens`, `GeneratedTokens`): chat rows with the image count, each field as the
    /// line says; a bad count names its line and column.
    #[test]
    fn the_multimodal_trace_keeps_its_image_counts() {
        let csv = "TIMESTAMP,NumImages,ContextTokens,GeneratedTokens\n\
                   2024-10-15 00:00:00.013467+00:00,1,2187,27\n\
                   2024-10-15 00:00:00.161420+00:00,0,431,9\n\
                   2024-10-15 00:00:01.5+00:00,3,6702,112\n";
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("AzureLMMInferenceTrace_multimodal.csv");
        std::fs::write(&p, csv).unwrap();
        assert_eq!(crate::detect(&p).unwrap(), Format::Azure);
        let rows = import(&p, "m").unwrap();
        let lines: Vec<Vec<&str>> = csv
            .lines()
            .skip(1)
            .map(|l| l.split(',').collect())
            .collect();
        assert_eq!(rows.len(), lines.len());
        for (r, f) in rows.iter().zip(&lines) {
            assert_eq!(r.arrival_time_us, parse_timestamp(f[0]).unwrap());
            assert_eq!(r.images, Some(f[1].parse().unwrap()));
            assert_eq!(r.prompt_tokens, Some(f[2].parse().unwrap()));
            assert_eq!(r.output_tokens, Some(f[3].parse().unwrap()));
            assert_eq!(r.endpoint, MULTIMODAL_ENDPOINT);
        }
        std::fs::write(&p, csv.replace(",3,", ",three,")).unwrap();
        let e = import(&p, "m").unwrap_err().to_string();
        assert!(e.contains(":4: NumImages"), "{e}");
    }

    #[test]
    fn timestamps_of_both_releases_parse() {
        // 2023-11-16 18:17:03 UTC = 1700158623.
        assert_eq!(
            parse_timestamp("2023-11-16 18:17:03.9799600").unwrap(),
            1_700_158_623_979_960
        );
        assert_eq!(
            parse_timestamp("2023-11-16 18:17:03.9799607").unwrap(),
            1_700_158_623_979_960
        );
        // 2024-05-10 00:00:00 UTC = 1715299200.
        assert_eq!(
            parse_timestamp("2024-05-10 00:00:00.009930+00:00").unwrap(),
            1_715_299_200_009_930
        );
        assert_eq!(
            parse_timestamp("2024-05-10 00:00:00.00993+00:00").unwrap(),
            1_715_299_200_009_930
        );
        assert_eq!(
            parse_timestamp("2024-05-10 00:00:01+00:00").unwrap(),
            1_715_299_201_000_000
        );
        assert_eq!(
            parse_timestamp("2024-05-10T02:00:01+02:00").unwrap(),
            1_715_299_201_000_000
        );
        assert_eq!(parse_timestamp("1970-01-01 00:00:00").unwrap(), 0);
        assert_eq!(
            parse_timestamp("2024-02-29 00:00:00Z").unwrap(),
            1_709_164_800_000_000
        );
        for bad in [
            "2023-02-29 00:00:00",
            "2023-11-16",
            "2023-11-16 25:00:00",
            "2023-11-16 18:17:03.",
            "2023-11-16 18:17:03+0000",
            "yesterday",
        ] {
            assert!(parse_timestamp(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn both_csv_layouts_import_and_bad_rows_name_their_line() {
        let dir = tempfile::tempdir().unwrap();
        let p23 = dir.path().join("code23.csv");
        std::fs::write(&p23, "TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:17:03.9799600,4808,10\r\n2023-11-16 18:17:04.0319600,3180,8\r\n").unwrap();
        let p24 = dir.path().join("conv24.csv");
        std::fs::write(&p24, "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00.009930+00:00,10,2\n2024-05-10 00:00:00.2+00:00,20,0\n\n2024-05-10 00:00:01+00:00,30,3\n").unwrap();
        let a = import(&p23, "a").unwrap();
        assert_eq!(a.len(), 2);
        assert_eq!(a[1].arrival_time_us - a[0].arrival_time_us, 52_000);
        assert_eq!(
            (
                a[0].request_id.as_str(),
                a[0].prompt_tokens,
                a[0].output_tokens
            ),
            ("a:2", Some(4808), Some(10))
        );
        let b = import(&p24, "b").unwrap();
        assert_eq!(
            b.iter()
                .map(|r| r.arrival_time_us - b[0].arrival_time_us)
                .collect::<Vec<_>>(),
            vec![0, 190_070, 990_070]
        );
        assert_eq!(b[2].request_id, "b:5");

        let bad = dir.path().join("bad.csv");
        std::fs::write(&bad, "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00+00:00,10,2\n2024-05-10 00:00:00+00:00,-1,2\n").unwrap();
        let e = import(&bad, "x").unwrap_err().to_string();
        assert!(
            e.contains("bad.csv:3") && e.contains("ContextTokens"),
            "{e}"
        );
        std::fs::write(
            &bad,
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00+00:00,10\n",
        )
        .unwrap();
        assert!(import(&bad, "x")
            .unwrap_err()
            .to_string()
            .contains("bad.csv:2"));
        std::fs::write(&bad, "TIMESTAMP,Tokens\n").unwrap();
        assert!(import(&bad, "x")
            .unwrap_err()
            .to_string()
            .contains("ContextTokens"));
    }

    #[test]
    fn shared_azure_2023_code_sample_imports_exactly() {
        let Some(p) = test_shared_data("AzureLLMInferenceTrace_code.csv") else {
            return;
        };
        let opts = ImportOptions::default();
        let (rows, stats) = import_file(&p, &opts, "azure").unwrap();
        assert_eq!(stats.format, Format::Azure);
        assert_eq!(rows.len(), 8_819);
        assert_eq!(stats.prompt_tokens, 18_059_974);
        assert_eq!(stats.output_tokens, 245_896);
        // 2023-11-16 18:17:03.97996 to 19:14:19.928016.
        assert_eq!(stats.first_arrival_us, Some(1_700_158_623_979_960));
        assert_eq!(stats.span_us(), 3_435_948_056);
        assert_eq!(stats.failures, 0);
    }
}
