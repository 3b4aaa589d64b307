//! Which API a request speaks, from its method and path: the one rule capture (what it
//! records), replay (how it sends a row and reads the answer) and the sim (what it serves)
//! share.
//!
//! Generation APIs stream answers that are read event by event ([`crate::sse::read_event_of`]);
//! the others (embeddings, rerank, score) are read whole and recorded without generated
//! output.

/// An API llmreplay records and replays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Api {
    /// OpenAI text completions (`POST …/completions`, not `/chat/completions`).
    Completions,
    /// OpenAI chat completions (`POST …/chat/completions`).
    Chat,
    /// OpenAI Responses (`POST …/responses`): typed events (`response.output_text.delta`, …).
    Responses,
    /// Anthropic Messages (`POST …/messages`): typed events (`content_block_delta`, …).
    Messages,
    /// Embeddings (`POST …/embeddings`): no generated output.
    Embeddings,
    /// Rerank (`POST …/rerank`, as vLLM and TEI serve it): no generated output.
    Rerank,
    /// Score (`POST …/score`, vLLM): no generated output.
    Score,
}

impl Api {
    /// Every API, in the order of [`Api::name`]'s table.
    pub const ALL: [Api; 7] = [
        Api::Completions,
        Api::Chat,
        Api::Responses,
        Api::Messages,
        Api::Embeddings,
        Api::Rerank,
        Api::Score,
    ];

    /// The API of a request with method `post` (true for POST) to `path` (no query), by the
    /// path's last segment(s) whatever prefix a gateway puts before them (`/v1/…`,
    /// `/openai/v1/…`); `None` for anything else (GET `/v1/models`, `/v1/messages/count_tokens`,
    /// `GET /v1/responses/{id}`).
    pub fn of(post: bool, path: &str) -> Option<Api> {
        if !post {
            return None;
        }
        let p = path.trim_end_matches('/');
        let last = p.rsplit('/').next().unwrap_or("");
        Some(match last {
            "completions" => {
                if p[..p.len() - last.len()]
                    .trim_end_matches('/')
                    .ends_with("/chat")
                    || p == "chat/completions"
                {
                    Api::Chat
                } else {
                    Api::Completions
                }
            }
            "responses" => Api::Responses,
            "messages" => Api::Messages,
            "embeddings" => Api::Embeddings,
            "rerank" => Api::Rerank,
            "score" => Api::Score,
            _ => return None,
        })
    }

    /// The API of a trace row's `endpoint` (its path), as [`Api::of`] a POST.
    pub fn of_endpoint(endpoint: &str) -> Option<Api> {
        let path = endpoint.split('?').next().unwrap_or(endpoint);
        Api::of(true, path)
    }

    /// Whether it generates output (streamed or not): completions, chat, Responses and
    /// Messages. The others are answered whole with no generated tokens.
    pub fn generates(self) -> bool {
        matches!(
            self,
            Api::Completions | Api::Chat | Api::Responses | Api::Messages
        )
    }

    /// Whether its stream is typed events (Responses, Messages) rather than OpenAI chunks
    /// with `choices` ended by `[DONE]`.
    pub fn typed_events(self) -> bool {
        matches!(self, Api::Responses | Api::Messages)
    }

    /// A short name: `completions`, `chat`, `responses`, `messages`, `embeddings`, `rerank`,
    /// `score`.
    pub fn name(self) -> &'static str {
        match self {
            Api::Completions => "completions",
            Api::Chat => "chat",
            Api::Responses => "responses",
            Api::Messages => "messages",
            Api::Embeddings => "embeddings",
            Api::Rerank => "rerank",
            Api::Score => "score",
        }
    }

    /// Bytes a whole response of the API holds only when it carries reasoning (a cheap
    /// search before reading its reasoning text): `"reasoning` (chat's `reasoning_content`,
    /// Responses' `reasoning` items), `"thinking` (Messages' thinking blocks).
    pub fn reasoning_marker(self) -> &'static [u8] {
        match self {
            Api::Messages => b"\"thinking",
            _ => b"\"reasoning",
        }
    }

    /// The usual path of the API (`/v1/…`).
    pub fn default_path(self) -> &'static str {
        match self {
            Api::Completions => "/v1/completions",
            Api::Chat => "/v1/chat/completions",
            Api::Responses => "/v1/responses",
            Api::Messages => "/v1/messages",
            Api::Embeddings => "/v1/embeddings",
            Api::Rerank => "/v1/rerank",
            Api::Score => "/v1/score",
        }
    }
}

impl std::fmt::Display for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_of_a_path() {
        for (post, path, want) in [
            (true, "/v1/completions", Some(Api::Completions)),
            (true, "/v1/completions/", Some(Api::Completions)),
            (true, "/v1/chat/completions", Some(Api::Chat)),
            (true, "/openai/v1/chat/completions", Some(Api::Chat)),
            (true, "/v1/responses", Some(Api::Responses)),
            (true, "/v1/messages", Some(Api::Messages)),
            (true, "/anthropic/v1/messages", Some(Api::Messages)),
            (true, "/v1/embeddings", Some(Api::Embeddings)),
            (true, "/v1/rerank", Some(Api::Rerank)),
            (true, "/rerank", Some(Api::Rerank)),
            (true, "/v2/rerank", Some(Api::Rerank)),
            (true, "/score", Some(Api::Score)),
            (false, "/v1/chat/completions", None),
            (false, "/v1/models", None),
            (true, "/v1/models", None),
            (true, "/v1/messages/count_tokens", None),
            (false, "/v1/responses/resp_123", None),
            (true, "/v1/responses/resp_123/cancel", None),
            (true, "/", None),
            (true, "", None),
            (true, "/chatcompletions", None),
        ] {
            assert_eq!(Api::of(post, path), want, "{post} {path}");
        }
        assert_eq!(
            Api::of_endpoint("/v1/chat/completions?x=1"),
            Some(Api::Chat)
        );
        for a in Api::ALL {
            assert_eq!(Api::of_endpoint(a.default_path()), Some(a));
        }
    }

    #[test]
    fn which_apis_generate_and_which_stream_typed_events() {
        let gen: Vec<_> = Api::ALL.iter().filter(|a| a.generates()).collect();
        assert_eq!(
            gen,
            [
                &Api::Completions,
                &Api::Chat,
                &Api::Responses,
                &Api::Messages
            ]
        );
        let typed: Vec<_> = Api::ALL.iter().filter(|a| a.typed_events()).collect();
        assert_eq!(typed, [&Api::Responses, &Api::Messages]);
    }
}
