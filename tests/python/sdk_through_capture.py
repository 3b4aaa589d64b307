"""The official `openai` and `anthropic` SDKs through `llmreplay capture` (issue 51).

Driven by `tests/real_engine.rs` (`the_official_sdks_through_capture_are_recorded`), not by
pytest: `python3 tests/python/sdk_through_capture.py CAPTURE_URL API_KEY MODEL`. Sends chat
(streamed and not), Responses (streamed and not) and Messages (streamed and not) requests,
each with an `x-marker` header capture records as the row's session, and prints one JSON
line per request with the usage the SDK received: prompt tokens (Messages: input + cache
read + cache creation), output tokens, cached tokens.

Needs `pip install openai anthropic`.
"""

import json
import sys

import anthropic
import openai


def main() -> None:
    base, key, model = sys.argv[1], sys.argv[2], sys.argv[3]
    oa = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=300)
    an = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0, timeout=300)
    ask = "Name three colors of the rainbow, one per line."

    def emit(marker, api, stream, prompt, output, cached=None):
        print(
            json.dumps(
                {
                    "marker": marker,
                    "api": api,
                    "stream": stream,
                    "prompt_tokens": prompt,
                    "output_tokens": output,
                    "cached_tokens": cached,
                }
            ),
            flush=True,
        )

    def hdr(marker):
        return {"x-marker": marker}

    # Chat, whole and streamed (asking for usage itself: capture then injects nothing).
    r = oa.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": ask}],
        max_tokens=24,
        extra_headers=hdr("chat"),
    )
    emit("chat", "chat", False, r.usage.prompt_tokens, r.usage.completion_tokens)
    usage = None
    for chunk in oa.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": ask + " Then stop."}],
        max_tokens=24,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers=hdr("chat-stream"),
    ):
        if chunk.usage is not None:
            usage = chunk.usage
    emit("chat-stream", "chat", True, usage.prompt_tokens, usage.completion_tokens)

    # Responses, whole and streamed.
    r = oa.responses.create(
        model=model,
        instructions="Be brief.",
        input=ask,
        max_output_tokens=24,
        extra_headers=hdr("responses"),
    )
    u = r.usage
    emit(
        "responses",
        "responses",
        False,
        u.input_tokens,
        u.output_tokens,
        u.input_tokens_details.cached_tokens if u.input_tokens_details else None,
    )
    final = None
    for ev in oa.responses.create(
        model=model,
        input=[{"role": "user", "content": [{"type": "input_text", "text": ask}]}],
        max_output_tokens=24,
        stream=True,
        extra_headers=hdr("responses-stream"),
    ):
        if ev.type in ("response.completed", "response.incomplete"):
            final = ev.response
    u = final.usage
    emit(
        "responses-stream",
        "responses",
        True,
        u.input_tokens,
        u.output_tokens,
        u.input_tokens_details.cached_tokens if u.input_tokens_details else None,
    )

    # Messages, whole and streamed.
    def prompt_of(u):
        return (
            u.input_tokens
            + (u.cache_read_input_tokens or 0)
            + (u.cache_creation_input_tokens or 0)
        )

    m = an.messages.create(
        model=model,
        max_tokens=24,
        system="Be brief.",
        messages=[{"role": "user", "content": ask}],
        extra_headers=hdr("messages"),
    )
    emit(
        "messages",
        "messages",
        False,
        prompt_of(m.usage),
        m.usage.output_tokens,
        m.usage.cache_read_input_tokens,
    )
    with an.messages.stream(
        model=model,
        max_tokens=24,
        messages=[{"role": "user", "content": [{"type": "text", "text": ask}]}],
        extra_headers=hdr("messages-stream"),
    ) as s:
        for _ in s:
            pass
        m = s.get_final_message()
    emit(
        "messages-stream",
        "messages",
        True,
        prompt_of(m.usage),
        m.usage.output_tokens,
        m.usage.cache_read_input_tokens,
    )


if __name__ == "__main__":
    main()
