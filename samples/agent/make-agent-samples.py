#!/usr/bin/env python3
"""Writes the small agent and production trace samples in samples/agent/, made by the project
from each format's published field list (the real files are not public here). Deterministic:
the same files on every run. Run from the repository root:

    python3 samples/agent/make-agent-samples.py

Needs pyarrow for the Baseten Parquet sample.
"""
import datetime
import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parent
rng = random.Random(42)


def hashes(n_tokens, block, base):
    return [base + i for i in range((n_tokens + block - 1) // block)]


def dynamo():
    """Three agent sessions: a main trajectory of turns with tool spans between them, and a
    subagent trajectory spawned from it; one session in the first release's field names."""
    lines = []
    t0 = 1_777_312_800_000
    for s in range(3):
        sid = f"run-{s}"
        old_names = s == 2
        current = s == 1  # dynamo.request.trace.v1: a trajectory is a session_id of its own
        schema = "dynamo.request.trace.v1" if current else "dynamo.agent.trace.v1"
        def ctx(traj, parent=None):
            if current:
                c = {"session_id": f"{sid}:{traj}"}
                if parent:
                    c["parent_session_id"] = f"{sid}:{parent}"
            elif old_names:
                c = {"workflow_type_id": "coding_agent", "workflow_id": sid, "program_id": f"{sid}:{traj}"}
                if parent:
                    c["parent_program_id"] = f"{sid}:{parent}"
            else:
                c = {"session_type_id": "coding_agent", "session_id": sid, "trajectory_id": f"{sid}:{traj}"}
                if parent:
                    c["parent_trajectory_id"] = f"{sid}:{parent}"
            return c
        now = t0 + s * 1500
        context = 900 + 200 * s
        for turn in range(6):
            total = round(rng.uniform(300, 900), 1)
            out = rng.randint(20, 120)
            lines.append((now + total, {
                "schema": schema, "event_type": "request_end",
                "event_time_unix_ms": int(now + total), "event_source": "dynamo",
                "agent_context": ctx("main"),
                "request": {
                    "request_id": f"dyn-{s}-{turn}", "x_request_id": f"llm-call-{s}-{turn}",
                    "model": "coder-7b", "input_tokens": context, "output_tokens": out,
                    "cached_tokens": max(0, context - 300), "request_received_ms": int(now),
                    "ttft_ms": round(rng.uniform(20, 90), 1), "total_time_ms": total,
                    "kv_hit_rate": 0.8, "queue_depth": rng.randint(0, 4),
                    "replay": {"trace_block_size": 64, "input_length": context,
                               "input_sequence_hashes": hashes(context, 64, 1000 * s)},
                },
            }))
            end = now + total
            tool = round(rng.uniform(100, 600), 1)
            lines.append((end + 1, {
                "schema": schema, "event_type": "tool_start",
                "event_time_unix_ms": int(end + 1), "event_source": "harness",
                "agent_context": ctx("main"),
                "tool": {"tool_call_id": f"call-{s}-{turn}", "tool_class": "bash",
                         "started_at_unix_ms": int(end + 1), "status": "running"},
            }))
            lines.append((end + 1 + tool, {
                "schema": schema, "event_type": "tool_end",
                "event_time_unix_ms": int(end + 1 + tool), "event_source": "harness",
                "agent_context": ctx("main"),
                "tool": {"tool_call_id": f"call-{s}-{turn}", "tool_class": "bash",
                         "started_at_unix_ms": int(end + 1), "ended_at_unix_ms": int(end + 1 + tool),
                         "status": "succeeded", "duration_ms": tool, "output_bytes": 2048},
            }))
            if turn == 2:
                sub = end + 50
                for k in range(3):
                    stotal = round(rng.uniform(200, 500), 1)
                    lines.append((sub + stotal, {
                        "schema": schema, "event_type": "request_end",
                        "event_time_unix_ms": int(sub + stotal), "event_source": "dynamo",
                        "agent_context": ctx("researcher", "main"),
                        "request": {
                            "request_id": f"dyn-{s}-sub-{k}", "model": "coder-7b",
                            "input_tokens": 400 + 150 * k, "output_tokens": 40,
                            "request_received_ms": int(sub), "ttft_ms": 30.0, "total_time_ms": stotal,
                            "replay": {"trace_block_size": 64, "input_length": 400 + 150 * k,
                                       "input_sequence_hashes": hashes(400 + 150 * k, 64, 1000 * s + 500)},
                        },
                    }))
                    sub += stotal + rng.uniform(50, 200)
            now = end + 2 + tool + rng.uniform(50, 400)
            context += out + rng.randint(100, 400)
    lines.sort(key=lambda x: x[0])
    with open(OUT / "dynamo-agent.jsonl", "w") as f:
        for at, ev in lines:
            if ev["schema"] == "dynamo.request.trace.v1":
                ev = {"timestamp": int(at - t0), "event": ev}  # the file sink's envelope
            f.write(json.dumps(ev) + "\n")


def copilot():
    """Four coding-agent sessions of user turns, each a few LLM calls with tool batches between
    them; one call the user cancelled."""
    start = datetime.datetime(2026, 6, 1, 10, 0, 0, tzinfo=datetime.timezone.utc)
    with open(OUT / "copilot-agent.jsonl", "w") as f:
        for s in range(4):
            now = start + datetime.timedelta(seconds=2.5 * s)
            turns = []
            prompt = 2000 + 500 * s
            for t in range(3 if s % 2 == 0 else 2):
                calls, batches = [], []
                for c in range(rng.randint(2, 4)):
                    dur = round(rng.uniform(400, 1500), 1)
                    comp = rng.randint(30, 200)
                    cancelled = s == 1 and t == 1 and c == 1
                    mid = f"msg-{s}-{t}-{c}"
                    end = now + datetime.timedelta(milliseconds=dur)
                    calls.append({
                        "message_id": mid,
                        # The release stamps a call when it ends.
                        "timestamp": end.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                        "duration_ms": dur, "initiator_type": "user" if c == 0 else "agent",
                        "model": "Model A" if s != 3 else "Model B",
                        "result": "UserCancel" if cancelled else "Success", "status_code": "OK",
                        "tokens": {"total": prompt + comp, "prompt": prompt, "completion": comp,
                                   "cached": int(prompt * 0.8), "cached_pct": 80.0},
                        "message_metadata": [{"type": "System", "role": "system", "sequenceId": 0, "token_len": 1200},
                                             {"type": "UserMessage", "role": "user", "sequenceId": 1, "token_len": prompt - 1200}],
                    })
                    now += datetime.timedelta(milliseconds=dur)
                    tool = round(rng.uniform(200, 900), 1)
                    batches.append({
                        "timestamp": now.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                        "duration_ms": tool, "auto_continue": True, "result": "Success", "request_id": mid,
                        "function_calls": [{"name": "run_in_terminal", "status": 1, "duration_ms": tool - 5}],
                    })
                    now += datetime.timedelta(milliseconds=tool + 20)
                    prompt += comp + rng.randint(200, 600)
                turns.append({"turn_id": f"turn-{s}-{t}", "llm_calls": calls, "tool_batches": batches})
                now += datetime.timedelta(seconds=rng.uniform(1, 3))
            if s == 2:
                # A turn whose calls failed before any was recorded, as the release has them.
                turns.append({"turn_id": f"turn-{s}-x", "llm_calls": None, "tool_batches": []})
            f.write(json.dumps({"session_id": f"sess-{s}", "date": "2026-06-01", "turns": turns}) + "\n")


def weka():
    """Five agent sessions as kv-cache-tester's docs/trace_replay_tester.md describes them:
    streamed ("s", with ttft) and non-streamed ("n") calls of 64-token blocks with api and
    think times; session 0 spawns a sub-agent (its calls timed from the spawn) that the
    parent waits for."""
    with open(OUT / "weka-agent.jsonl", "w") as f:
        for s in range(5):
            t, ctx, reqs = 0.0, 400 + 100 * s, []
            prev_think = None
            for k in range(rng.randint(5, 8)):
                api = round(rng.uniform(0.5, 2.5), 3)
                think = round(rng.uniform(0.2, 1.5), 3)
                out = rng.randint(15, 120)
                streamed = k % 2 == 0
                r = {"t": round(t, 3), "type": "s" if streamed else "n", "model": "claude-opus-4-7",
                     "in": ctx, "out": out, "hash_ids": list(range((ctx + 63) // 64)),
                     "input_types": ["tool_result" if k else "text"], "output_types": ["text", "tool_use"],
                     "stop": "tool_use", "api_time": api}
                if streamed:
                    r["ttft"] = round(api * 0.3, 3)
                if prev_think is not None:
                    r["think_time"] = prev_think
                reqs.append(r)
                prev_think = think
                t += api + think
                ctx += out + rng.randint(50, 300)
                if s == 0 and k == 2:
                    spawn, sub, st = round(t, 3), [], 0.0
                    for j in range(3):
                        sapi = round(rng.uniform(0.3, 1.0), 3)
                        sub.append({"t": round(st, 3), "type": "n", "model": "claude-haiku-4-5",
                                    "in": 300 + 100 * j, "out": 20, "hash_ids": list(range(5 + 2 * j)),
                                    "api_time": sapi, "think_time": 0.0 if j == 0 else 0.2})
                        st += sapi + 0.2
                    duration = round(st * 1000)
                    reqs.append({"t": spawn, "type": "subagent", "agent_id": "agent_001",
                                 "subagent_type": "Explore", "duration_ms": duration,
                                 "total_tokens": sum(q["in"] + q["out"] for q in sub),
                                 "tool_use_count": 2, "status": "completed",
                                 "models": ["claude-haiku-4-5"], "requests": sub})
                    # The parent calls again once the sub-agent is done.
                    t = spawn + st + 0.5
                    prev_think = None
            f.write(json.dumps({"id": f"{s:04d}weka{s:028d}", "models": ["claude-opus-4-7"],
                                "block_size": 64, "hash_id_scope": "local", "tool_tokens": 9000,
                                "system_tokens": 2500, "requests": reqs}) + "\n")


def baseten():
    """Forty production completion requests with the columns AIPerf's Baseten loader reads:
    the prompt, TTFT, duration and the cancel flag (five canceled), block hashes, sessions."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    t0 = 1_777_312_800_000
    rows = []
    now = t0
    for i in range(40):
        now += rng.randint(50, 500)
        inp, out = rng.randint(100, 3000), rng.randint(10, 400)
        ttft = rng.randint(20, 150)
        dur = ttft + int(out * rng.uniform(8, 15))
        canceled = i % 8 == 5
        if canceled:
            dur = ttft + int((dur - ttft) * 0.4)
            out = max(1, int(out * 0.4))
        prompt = " ".join(["word"] * (inp // 2))
        rows.append((now, prompt, inp, out, list(range(i % 6, i % 6 + (inp + 15) // 16)), 16,
                     f"conv-{i % 6}", i % 6, dur, ttft if i != 13 else None, int(canceled),
                     "llama-3.1-8b", "org-7"))
    cols = list(zip(*rows))
    table = pa.table({
        "timestamp_start_unix_ms": pa.array(cols[0], pa.int64()),
        "prompt": pa.array(cols[1], pa.string()),
        "input_tokens": pa.array(cols[2], pa.int64()),
        "output_tokens": pa.array(cols[3], pa.int64()),
        "total_hashes": pa.array(cols[4], pa.list_(pa.int64())),
        "block_size": pa.array(cols[5], pa.int64()),
        "provided_session_id": pa.array(cols[6], pa.string()),
        "poor_man_session_id": pa.array(cols[7], pa.int64()),
        "duration_e2e_ms": pa.array(cols[8], pa.int64()),
        "duration_ttft_ms": pa.array(cols[9], pa.int64()),
        "request_canceled": pa.array(cols[10], pa.int8()),
        "model_name": pa.array(cols[11], pa.string()),
        "org_id": pa.array(cols[12], pa.string()),
    })
    pq.write_table(table, OUT / "baseten-40.parquet", compression="snappy")


if __name__ == "__main__":
    dynamo()
    copilot()
    weka()
    baseten()
