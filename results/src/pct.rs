//! Numbers as printed: one rounding rule for every percentage of requests (good%, goodput
//! against throughput) on the console and in reports, and levels and bounds without
//! trailing zeros ([`fmt_num`]).

/// `part / whole`, None when `whole` is not positive.
pub fn share(part: f64, whole: f64) -> Option<f64> {
    (whole > 0.0 && part.is_finite()).then(|| part / whole)
}

/// A share (0..=1) as a whole percent, halves rounded up (12.5% → 13%, as people and other
/// tools round; Rust's `{:.0}` rounds a half to even, 12%). A share that is neither none nor
/// all never reads as either: `<1%`, `>99%`.
pub fn fmt_share(share: f64) -> String {
    let p = share * 100.0;
    let r = (p + 0.5).floor();
    if p > 0.0 && r < 1.0 {
        "<1%".into()
    } else if p < 100.0 && r >= 100.0 {
        ">99%".into()
    } else {
        format!("{r:.0}%")
    }
}

/// A number without needless decimals: 16, 2.5, 0.25.
pub fn fmt_num(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_round_up_and_the_ends_are_kept_apart() {
        assert_eq!(fmt_share(0.125), "13%");
        assert_eq!(fmt_share(0.124), "12%");
        assert_eq!(fmt_share(0.0), "0%");
        assert_eq!(fmt_share(0.004), "<1%");
        assert_eq!(fmt_share(0.996), ">99%");
        assert_eq!(fmt_share(1.0), "100%");
        assert_eq!(share(1.0, 0.0), None);
    }
}
