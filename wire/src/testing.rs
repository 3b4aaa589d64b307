//! Settings shared by the workspace's tests (not part of the wire's API).

/// How many cases a property test or fuzz loop runs: `LLMREPLAY_FUZZ_CASES` when set (as
/// `bench/fuzz.sh` does, for many more), else the test's own bounded `default` for CI.
pub fn fuzz_cases(default: u32) -> u32 {
    std::env::var("LLMREPLAY_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
