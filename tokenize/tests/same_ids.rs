//! The built-in encodings (`cl100k_base`, `o200k_base`) encode with `bpe-openai`; these tests
//! hold it to tiktoken-rs's ids, token for token, on real prose and code (this repository's
//! own documents and sources, whole and cut at arbitrary bytes) and on generated text made of
//! the pieces BPE pre-tokenizers treat specially: whitespace runs before words and at the
//! end, newlines, contractions, digit runs, punctuation, and multi-byte characters.

use proptest::prelude::*;
use tokenize::Tokenizer;

fn reference(name: &str) -> &'static tiktoken_rs::CoreBPE {
    match name {
        "cl100k_base" => tiktoken_rs::cl100k_base_singleton(),
        _ => tiktoken_rs::o200k_base_singleton(),
    }
}

fn check(name: &str, tok: &Tokenizer, text: &str) {
    let want = reference(name).encode_ordinary(text);
    let got = tok.encode(text).unwrap();
    assert_eq!(got, want, "{name} on {text:?}");
    assert_eq!(
        tok.count(text).unwrap(),
        want.len(),
        "{name} count on {text:?}"
    );
}

#[test]
fn the_repository_documents_and_sources_encode_identically() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let files = [
        "README.md",
        "ARCHITECTURE.md",
        "bench/README.md",
        "tokenize/src/lib.rs",
        "proxy/src/recording/writer.rs",
        "replay/src/prompt/words.rs",
    ];
    for name in ["cl100k_base", "o200k_base"] {
        let tok = Tokenizer::load(name).unwrap();
        for f in files {
            let text = std::fs::read_to_string(root.join(f)).unwrap();
            check(name, &tok, &text);
            // Cut at char boundaries every ~997 bytes: pieces start and end mid-word,
            // mid-space-run and mid-line.
            let mut start = 0;
            while start < text.len() {
                let mut end = (start + 997).min(text.len());
                while !text.is_char_boundary(end) {
                    end += 1;
                }
                check(name, &tok, &text[start..end]);
                start = end;
            }
        }
    }
}

const PIECES: &[&str] = &[
    " ",
    "  ",
    "   ",
    "\t",
    "\n",
    "\n\n",
    "\r\n",
    " \n ",
    "a",
    "the",
    " the",
    "The",
    "HELLO",
    "'s",
    "'S",
    "'t",
    "'re",
    "'ve",
    "'m",
    "'ll",
    "'d",
    "don't",
    "1",
    "12",
    "123",
    "1234",
    "12345",
    "3.14",
    ".",
    ",",
    "!",
    "?!",
    "...",
    "--",
    "—",
    "(",
    ")",
    "{",
    "}",
    "<|endoftext|>",
    "é",
    "naïve",
    "日本語",
    "中文",
    "🙂",
    "👍🏽",
    "ß",
    "Ĳ",
    "\u{301}",
    "a\u{301}",
    "ǅ",
    "Ⅻ",
    "٣",
    "x_y",
    "fn",
    "=>",
    "//",
    "/*",
    "http://a.b/c?d=e",
    "\u{a0}",
    "\u{2028}",
    "\u{3000}",
    "$",
    "%",
    "€",
    "ʼ",
    "ǈa",
    "\u{200b}",
    "ΑΒΓ",
    "αβγ",
    "Привет",
    "мир",
    "😀😀",
    "\u{feff}",
];

fn text() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(PIECES), 0..60).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn generated_text_encodes_identically(t in text()) {
        for name in ["cl100k_base", "o200k_base"] {
            let tok = Tokenizer::load(name).unwrap();
            let want = reference(name).encode_ordinary(&t);
            prop_assert_eq!(tok.encode(&t).unwrap(), want.clone(), "{} on {:?}", name, t);
            prop_assert_eq!(tok.count(&t).unwrap(), want.len());
        }
    }

    #[test]
    fn arbitrary_strings_encode_identically(t in "\\PC{0,80}") {
        for name in ["cl100k_base", "o200k_base"] {
            let tok = Tokenizer::load(name).unwrap();
            let want = reference(name).encode_ordinary(&t);
            prop_assert_eq!(tok.encode(&t).unwrap(), want, "{} on {:?}", name, t);
        }
    }
}
