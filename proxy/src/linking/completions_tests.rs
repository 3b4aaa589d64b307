use super::*;
use crate::prefix::fnv;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

fn ans(s: &str) -> Option<u64> {
    Some(TextHash::of(s))
}

#[test]
fn a_prompt_links_to_the_completion_whose_prompt_and_answer_it_starts_with() {
    let mut l = CompletionLinker::new(100);
    let p1 = "You are terse.\nUser: hi\nAssistant:";
    let a = l.observe("r1", 0, 1_000, p1, ans(" Hello!"), Some(3), None);
    assert_eq!((a.session_id.as_str(), a.parent_request_id), ("r1", None));
    // The answer as received (leading space), then the next question.
    let p2 = format!("{p1} Hello!\nUser: how are you?\nAssistant:");
    let b = l.observe(
        "r2",
        3_500,
        4_000,
        &p2,
        ans(" Fine,  thanks."),
        Some(4),
        None,
    );
    assert_eq!(b.session_id, "r1");
    assert_eq!(b.parent_request_id.as_deref(), Some("r1"));
    assert_eq!(b.think_time_us, Some(2_500));
    // The client trims at the join and adds its own whitespace: still r2's child.
    let p3 = format!(
        "{}\n\nFine,  thanks.\n\nUser: bye\nAssistant:",
        p2.trim_end()
    );
    let c = l.observe("r3", 5_000, 6_000, &p3, ans("Bye."), Some(2), None);
    assert_eq!(
        c.parent_request_id.as_deref(),
        Some("r2"),
        "the longest wins"
    );
    assert_eq!(c.session_id, "r1");
    // Another answer in the history is another conversation; so is the same prompt again.
    let p4 = format!("{p1} Hey.\nUser: how are you?\nAssistant:");
    let d = l.observe("r4", 7_000, 8_000, &p4, None, None, None);
    assert_eq!((d.session_id.as_str(), d.parent_request_id), ("r4", None));
    let e = l.observe("r5", 9_000, 9_500, p1, None, None, None);
    assert_eq!(e.parent_request_id, None, "a retry carries no answer");
    // A header session wins; a failed answer (None) is never continued.
    let f = l.observe("r6", 10_000, 11_000, "Q: x\nA:", None, None, Some("H"));
    assert_eq!(f.session_id, "H");
    let g = l.observe("r7", 12_000, 13_000, "Q: x\nA: y\nQ: z", None, None, None);
    assert_eq!(g.parent_request_id, None);
}

#[test]
fn old_keys_are_forgotten_and_lengths_stay_counted() {
    let mut l = CompletionLinker::new(2);
    for i in 0..5 {
        l.observe(
            &format!("r{i}"),
            0,
            10,
            &format!("p{i}"),
            ans("a"),
            None,
            None,
        );
    }
    assert_eq!(l.remembered(), 2);
    assert_eq!(l.lengths.values().sum::<u32>(), 2);
    assert_eq!(l.index.held(), 2);
    let old = l.observe("x", 20, 30, "p0 a more", None, None, None);
    assert_eq!(old.parent_request_id, None, "r0 was forgotten");
    let new = l.observe("y", 20, 30, "p4 a more", None, None, None);
    assert_eq!(new.parent_request_id.as_deref(), Some("r4"));
    // Whitespace-free keys: the same text with other whitespace is the same key.
    let k = |s: &str| walk(s, [].iter()).0;
    assert_eq!(k(" a b\n c "), k("abc"));
    assert_eq!(k("abc").1, fnv(FNV_OFFSET, b"abc"));
}

/// A synthetic multi-turn completions workload with known truth: 200 conversations of 2–10
/// turns, interleaved, two thirds sharing one of two system prompts, every 10th opening with
/// the same question (with the same system prompt: identical first prompts and, from a
/// deterministic model, identical answers), and three clients' ways of joining the answer
/// (as received with its leading space; trimmed, on a new line; trimmed, after a space).
#[test]
fn synthetic_multi_turn_completions_workload_links_at_least_98_percent() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    let systems = [
        "You are a helpful assistant.\n\n",
        "Réponds en français, brièvement.\n",
        "",
    ];
    struct Conv {
        prompt: String,
        turns: usize,
        done: usize,
        last: Option<String>,
        next_at: i64,
        join: usize,
    }
    let mut convs: Vec<Conv> = (0..200)
        .map(|i| Conv {
            prompt: systems[i % 3].to_string(),
            turns: rng.gen_range(2..=10),
            done: 0,
            last: None,
            next_at: rng.gen_range(0..5_000_000),
            join: i % 7 % 3,
        })
        .collect();
    let mut l = CompletionLinker::new(DEFAULT_MAX_KEYS);
    let mut now = 0i64;
    let (mut links, mut right, mut unexplained) = (0usize, 0usize, 0usize);
    // In flight: (end, conv, request id, prompt, answer, arrival).
    let mut in_flight: Vec<(i64, usize, String, String, String, i64)> = Vec::new();
    let mut seq = 0;
    loop {
        let mut due: Vec<usize> = (0..convs.len())
            .filter(|&c| {
                let v = &convs[c];
                v.done < v.turns && v.next_at <= now && v.next_at >= 0
            })
            .collect();
        due.shuffle(&mut rng);
        for c in due {
            let conv = &mut convs[c];
            let q = if conv.done == 0 && c % 10 == 0 {
                "What is the capital of France?".to_string()
            } else {
                format!("question {} of {c}: {}", conv.done, rng.gen::<u32>())
            };
            conv.prompt.push_str(&format!("User: {q}\nAssistant:"));
            // A deterministic model: the answer depends on the prompt only.
            let h = fnv(FNV_OFFSET, conv.prompt.as_bytes());
            let answer = format!(" The answer is {:x}.\n\nIt is  {}.", h, h % 97);
            let id = format!("req-{seq}");
            seq += 1;
            let end = now + rng.gen_range(50_000..2_000_000);
            in_flight.push((end, c, id, conv.prompt.clone(), answer, now));
            conv.next_at = -1;
        }
        in_flight.sort_by_key(|x| -x.0);
        let Some((end, c, id, prompt, answer, arrival)) = in_flight.pop() else {
            if convs.iter().all(|c| c.done >= c.turns) {
                break;
            }
            now = convs
                .iter()
                .filter(|c| c.next_at >= 0 && c.done < c.turns)
                .map(|c| c.next_at)
                .min()
                .unwrap();
            continue;
        };
        now = end;
        let tokens = Some(answer.split_whitespace().count() as i64);
        let link = l.observe(&id, arrival, end, &prompt, ans(&answer), tokens, None);
        let conv = &mut convs[c];
        if conv.done > 0 {
            links += 1;
            let ok = link.parent_request_id == conv.last;
            right += usize::from(ok);
            // Only a second turn after an identical opening (prompt and answer) can go wrong.
            let ambiguous = c % 10 == 0 && conv.done == 1;
            unexplained += usize::from(!(ok || ambiguous));
        } else {
            assert_eq!(link.parent_request_id, None, "a first turn has no parent");
        }
        conv.done += 1;
        conv.last = Some(id);
        match conv.join {
            0 => conv.prompt.push_str(&answer),
            1 => {
                conv.prompt.push('\n');
                conv.prompt.push_str(answer.trim());
            }
            _ => {
                conv.prompt.push(' ');
                conv.prompt.push_str(answer.trim());
            }
        }
        conv.prompt.push('\n');
        conv.next_at = end + rng.gen_range(100_000..3_000_000);
    }
    assert!(links > 800, "{links} links");
    assert_eq!(unexplained, 0);
    let share = right as f64 / links as f64;
    eprintln!("completions linking: {right} of {links} parent links right ({share:.4})");
    assert!(
        share >= 0.98,
        "{right} of {links} parent links right ({share:.4})"
    );
}
