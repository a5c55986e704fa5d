"""Chat formatting and structured output: what turns messages into a prompt and a reply into
messages, shared by the engine, the server and the TUI.

- `template`: ChatTemplate (the model's Jinja template, or a built-in one) and its errors.
- `builtin_templates`: llama.cpp's built-in templates by name (CHAT_TEMPLATE_NAMES).
- `sandbox`: the Jinja sandbox a hostile template runs in (time and size limits).
- `constraint`: ConstraintSpec and its token masks (JSON schema, regex, Lark, GBNF via llguidance).
- `json_schema`: the schemas behind `response_format` and tool calls.
- `tool_calls`: tool-call formats (Hermes, Qwen 3.5's XML, Llama 3, Mistral, ...) parsed from
  generated text, and ReplyStream (a reply as OpenAI deltas).
- `reasoning`: each template's thinking tags and preserved tokens; the reasoning budget.
- `harmony`: gpt-oss's channels (analysis, commentary, final) read back from a reply.
- `replies`: the reader of one reply, chosen for its template.
"""
