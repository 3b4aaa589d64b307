//! How many completed requests each latency metric covers ([`Coverage`]), and why each
//! request it leaves out is left out ([`Coverage::left_out`]): TTFT, ITL and TPOT exist only
//! for streamed requests, TPOT only for those with two output tokens or more, ITL only for
//! those in two chunks or more.

use serde::Serialize;

/// How many completed requests each latency metric covers: TTFT, ITL and TPOT exist only for
/// streamed requests; E2EL, throughput and goodput count every one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Coverage {
    /// Completed streamed requests with a first output chunk.
    pub ttft: usize,
    /// Completed streamed requests with more than one output token.
    pub tpot: usize,
    /// Completed streamed requests with two or more output chunks (one gap or more).
    pub itl: usize,
    /// Completed requests with an end time.
    pub e2el: usize,
    /// Completed requests that were not streamed (in E2EL, throughput and goodput only).
    pub not_streamed: usize,
    /// Completed streamed requests with one output token or none: no TPOT (it needs two).
    pub single_token: usize,
}

impl Coverage {
    /// The completed requests (of `completed`) that `metric` (`ttft`, `tpot`, `itl` or
    /// `e2el`) leaves out, by reason: (requests, why; `{}` in it stands for the metric's
    /// name), those with none left out. The counts add up to `completed` − the requests
    /// covered.
    pub fn left_out(&self, metric: &str, completed: usize) -> Vec<(usize, &'static str)> {
        let streamed = completed.saturating_sub(self.not_streamed);
        let mut v = Vec::new();
        let (covered, rest) = match metric {
            "ttft" => (self.ttft, "streamed without a first chunk"),
            "tpot" => {
                v.push((
                    self.single_token,
                    "with a single output token: no time per token after the first",
                ));
                (self.tpot, "without a token count or timing")
            }
            "itl" => (
                self.itl,
                "streamed in a single chunk: no gap between chunks",
            ),
            _ => {
                let rest = completed.saturating_sub(self.e2el);
                return [(rest, "without an end time")]
                    .into_iter()
                    .filter(|(n, _)| *n > 0)
                    .collect();
            }
        };
        let explained: usize = v.iter().map(|(n, _)| n).sum();
        v.insert(0, (self.not_streamed, "not streamed: {} does not apply"));
        v.push((
            streamed.saturating_sub(covered).saturating_sub(explained),
            rest,
        ));
        v.retain(|(n, _)| *n > 0);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 39, polish: "Requests in TPOT: 29 of 37 (6 not streamed)" left 2 requests
    /// (single-token outputs) unexplained.
    #[test]
    fn every_request_left_out_has_a_reason() {
        let c = Coverage {
            ttft: 31,
            tpot: 29,
            itl: 28,
            e2el: 37,
            not_streamed: 6,
            single_token: 2,
        };
        assert_eq!(
            c.left_out("tpot", 37),
            vec![
                (6, "not streamed: {} does not apply"),
                (
                    2,
                    "with a single output token: no time per token after the first"
                ),
            ]
        );
        assert_eq!(
            c.left_out("itl", 37),
            vec![
                (6, "not streamed: {} does not apply"),
                (3, "streamed in a single chunk: no gap between chunks"),
            ]
        );
        assert_eq!(
            c.left_out("ttft", 37),
            vec![(6, "not streamed: {} does not apply")]
        );
        assert_eq!(c.left_out("e2el", 37), vec![]);
        for m in ["ttft", "tpot", "itl", "e2el"] {
            let covered = match m {
                "ttft" => c.ttft,
                "tpot" => c.tpot,
                "itl" => c.itl,
                _ => c.e2el,
            };
            let out: usize = c.left_out(m, 37).iter().map(|(n, _)| n).sum();
            assert_eq!(covered + out, 37, "{m}");
        }
    }
}
