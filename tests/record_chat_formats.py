"""Records what llama.cpp's common/chat.cpp makes of the 2026 families' chats into
tests/golden/llama_cpp_chat_formats.json: gpt-oss (Harmony), Qwen 3.5 and Gemma 4 (its thought
channel and tool calls).

    python tests/record_chat_formats.py /tmp/llama_chat

/tmp/llama_chat is tests/llama_chat.cpp built against llama.cpp 11434 (its header says how).
For each case (a template from tests/data/chat_templates/, messages, tools, reasoning format,
enable_thinking, template kwargs) it stores the prompt llama.cpp renders, its generation
prompt and preserved tokens, and common_chat_parse's message for each model output listed.
"""
import json
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).parent
TEMPLATES = HERE / "data" / "chat_templates"
GPT_OSS, QWEN35, GEMMA4 = ("openai-gpt-oss-120b.jinja", "Qwen3.5-4B.jinja",
                           "google-gemma-4-31B-it.jinja")

WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city"},
        "days": {"type": "integer", "description": "How many days"}},
        "required": ["city"]}}}]
ASK = [{"role": "system", "content": "Be brief."},
       {"role": "user", "content": "What is the weather in Paris?"}]
CALLED = ASK + [
    {"role": "assistant", "content": "", "reasoning_content": "I should call the tool.",
     "tool_calls": [{"id": "call1", "type": "function", "function": {
         "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call1", "content": "{\"sky\": \"sunny\"}"}]
HISTORY = [{"role": "user", "content": "Hi"},
           {"role": "assistant", "content": "Hello!", "reasoning_content": "Greet back."},
           {"role": "user", "content": "Count to three."}]

HARMONY_OUTPUTS = [
    "<|channel|>analysis<|message|>The user wants weather.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>It is sunny in Paris.",
    "<|channel|>final<|message|>Just the answer.",
    "<|channel|>commentary to=assistant<|channel|>analysis<|message|>Stray header.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Done.",
    "<|channel|>analysis<|message|>First.<|end|><|start|>assistant<|channel|>analysis"
    "<|message|>Second.<|end|><|start|>assistant<|channel|>final<|message|>Both.",
    "<|channel|>commentary<|message|>Let me check.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Checked.",
]
HARMONY_CALLS = [
    "<|channel|>analysis<|message|>Need the tool.<|end|><|start|>assistant<|channel|>commentary"
    " to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}",
    "<|channel|>analysis<|message|>Need it.<|end|><|start|>assistant to=functions.get_weather"
    "<|channel|>commentary json<|message|>{\"city\": \"Paris\", \"days\": 2}",
    "<|channel|>analysis<|message|>No tool needed.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Sunny.",
]
QWEN_OUTPUTS = ["The user greets.\n</think>\n\nHello there!", "Plain answer."]
QWEN_CALLS = [
    "The user wants weather.\n</think>\n\n<tool_call>\n<function=get_weather>\n"
    "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n"
    "</function>\n</tool_call>",
    "Weather.\n</think>\n\nLet me look.\n<tool_call>\n<function=get_weather>\n"
    "<parameter=city>\nNew York\nCity\n</parameter>\n</function>\n</tool_call>",
    "No call.\n</think>\n\nIt is sunny.",
    "Straight to it.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n"
    "</parameter>\n</function>\n</tool_call>",
]
GEMMA_OUTPUTS = ["<|channel>thought\nThe user greets.<channel|>Hello there!", "Plain answer."]
GEMMA_CALLS = [
    "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}<tool_call|>",
    "<|channel>thought\nThe user wants weather.<channel|>Let me check."
    "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>,days:2}<tool_call|>",
    "<|tool_call>call:get_weather{city:<|\"|>He said \"hi\", then \\\"bye\\\"\n<|\"|>,"
    "days:-2.5e1,extra:{units:[<|\"|>metric<|\"|>,true,null,{deep:{}}],note:<|\"|>{\"a\": [1]}<|\"|>}}"
    "<tool_call|>",
    "<|channel>thought\nNo tool needed.<channel|>It is sunny.",
    "Sure.<channel|>dropped<|tool_call>call:get_weather{city:<|\"|>Rome<|\"|>}<tool_call|>",
]
GEMMA_TWO_CALLS = [
    "<|channel>thought\nTwo cities.<channel|><|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}"
    "<tool_call|><|tool_call>call:get_weather{city:<|\"|>Rome<|\"|>,days:3}<tool_call|>",
    "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}<tool_call|>"
    "<|tool_call>call:get_time{city:<|\"|>Rome<|\"|>}<tool_call|>",
]

CASES = [
    {"name": "gpt-oss plain", "template": GPT_OSS, "messages": ASK,
     "outputs": HARMONY_OUTPUTS},
    {"name": "gpt-oss reasoning none", "template": GPT_OSS, "messages": ASK,
     "reasoning_format": "none", "outputs": HARMONY_OUTPUTS},
    {"name": "gpt-oss effort high", "template": GPT_OSS, "messages": ASK,
     "kwargs": {"reasoning_effort": "high"}, "outputs": HARMONY_OUTPUTS[:1]},
    {"name": "gpt-oss developer", "template": GPT_OSS,
     "messages": [{"role": "developer", "content": "Answer in French."},
                  {"role": "user", "content": "Hello"}], "outputs": []},
    {"name": "gpt-oss history", "template": GPT_OSS, "messages": HISTORY, "outputs": []},
    {"name": "gpt-oss tools", "template": GPT_OSS, "messages": ASK, "tools": WEATHER,
     "outputs": HARMONY_CALLS},
    {"name": "gpt-oss tools reasoning none", "template": GPT_OSS, "messages": ASK,
     "tools": WEATHER, "reasoning_format": "none", "outputs": HARMONY_CALLS},
    {"name": "gpt-oss tool result", "template": GPT_OSS, "messages": CALLED, "tools": WEATHER,
     "outputs": ["<|channel|>analysis<|message|>It is sunny.<|end|>"
                 "<|start|>assistant<|channel|>final<|message|>Sunny in Paris."]},
    {"name": "qwen3.5 thinking", "template": QWEN35, "messages": HISTORY,
     "outputs": QWEN_OUTPUTS[:1]},
    {"name": "qwen3.5 no thinking", "template": QWEN35, "messages": HISTORY,
     "enable_thinking": False, "outputs": QWEN_OUTPUTS[1:]},
    {"name": "qwen3.5 reasoning none", "template": QWEN35, "messages": HISTORY,
     "reasoning_format": "none", "outputs": QWEN_OUTPUTS[:1]},
    {"name": "qwen3.5 kwargs no thinking", "template": QWEN35, "messages": HISTORY,
     "kwargs": {"enable_thinking": False}, "outputs": []},
    {"name": "qwen3.5 tools", "template": QWEN35, "messages": ASK, "tools": WEATHER,
     "outputs": QWEN_CALLS},
    {"name": "qwen3.5 tool result", "template": QWEN35, "messages": CALLED, "tools": WEATHER,
     "outputs": QWEN_OUTPUTS[:1]},
    {"name": "gemma4 thinking", "template": GEMMA4, "messages": HISTORY,
     "outputs": GEMMA_OUTPUTS[:1]},
    {"name": "gemma4 no thinking", "template": GEMMA4, "messages": HISTORY,
     "enable_thinking": False, "outputs": GEMMA_OUTPUTS[1:]},
    {"name": "gemma4 reasoning none", "template": GEMMA4, "messages": HISTORY,
     "reasoning_format": "none", "outputs": GEMMA_OUTPUTS[:1]},
    {"name": "gemma4 tools", "template": GEMMA4, "messages": ASK, "tools": WEATHER,
     "outputs": GEMMA_CALLS},
    {"name": "gemma4 tools parallel", "template": GEMMA4, "messages": ASK, "tools": WEATHER,
     "parallel_tool_calls": True, "outputs": GEMMA_TWO_CALLS},
    {"name": "gemma4 tools one call at a time", "template": GEMMA4, "messages": ASK,
     "tools": WEATHER, "outputs": GEMMA_TWO_CALLS[:1]},
    {"name": "gemma4 tools reasoning none", "template": GEMMA4, "messages": ASK,
     "tools": WEATHER, "reasoning_format": "none", "outputs": GEMMA_CALLS[1:2]},
    {"name": "gemma4 tools no thinking", "template": GEMMA4, "messages": ASK,
     "tools": WEATHER, "enable_thinking": False, "outputs": GEMMA_CALLS[:1]},
    {"name": "gemma4 tool result", "template": GEMMA4, "messages": CALLED, "tools": WEATHER,
     "outputs": ["<|channel>thought\nIt is sunny.<channel|>Sunny in Paris."]},
]


def record(binary: str) -> None:
    answers = []
    for case in CASES:
        request = {k: v for k, v in case.items() if k not in ("name",)}
        request["template"] = (TEMPLATES / case["template"]).read_text()
        done = subprocess.run([binary], input=json.dumps(request), capture_output=True,
                              text=True, timeout=60)
        if done.returncode != 0:
            raise SystemExit(f"{case['name']}: {done.stderr[-2000:]}")
        answers.append({"case": case, "llama_cpp": json.loads(done.stdout)})
    out = HERE / "golden" / "llama_cpp_chat_formats.json"
    out.write_text(json.dumps({"llama_cpp": "common/chat.cpp of build 11434 (tests/llama_chat.cpp)",
                               "answers": answers}, ensure_ascii=False, indent=1) + "\n",
                   encoding="utf-8")
    print(f"{len(answers)} cases → {out}")


if __name__ == "__main__":
    record(sys.argv[1])
