"""Records llama.cpp's built-in chat templates into llama_cpp_chat_builtin.json.

    python tests/golden/record_chat_builtin.py /path/to/llama.cpp/build/bin/libllama.so

Calls libllama's public `llama_chat_apply_template` (the template given by name, which
`llm_chat_detect_template` maps to the built-in one; no Jinja) through ctypes for every name that
`llama_chat_builtin_templates` lists, on conversations that reach each template's branches:
system prompts, several turns, whitespace that some templates trim, a conversation ending with
the assistant, roles besides system/user/assistant, no messages at all. Each with and without
the generation prompt (llama.cpp's add_ass).
"""
import ctypes
import json
import pathlib
import sys

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a pirate."}, {"role": "user", "content": "Say hello."}],
    [{"role": "user", "content": "Count to five."},
     {"role": "assistant", "content": "1, 2, 3, 4, 5."},
     {"role": "user", "content": "Now backwards."}],
    [{"role": "system", "content": "  Be brief.\n"},
     {"role": "user", "content": "\n Hello there \t"},
     {"role": "assistant", "content": "  Hi!  \n"},
     {"role": "user", "content": "Bye "}],
    [{"role": "system", "content": "First."}, {"role": "system", "content": "Second."},
     {"role": "user", "content": "Q"}, {"role": "assistant_tool_call", "content": "[call]"},
     {"role": "tool", "content": "42"}, {"role": "ipython", "content": "out"},
     {"role": "function", "content": "f"}, {"role": "assistant", "content": "A"}],
    [{"role": "user", "content": "Héllo, wörld — 日本語 ｜ <b>&amp;</b>"},
     {"role": "assistant", "content": "Réponse."}],
    [{"role": "user", "content": "U"}, {"role": "system", "content": "late system"}],
    [{"role": "émile", "content": "odd role"}, {"role": "user", "content": "multi\nline\n\ntext"}],
    [],
]


def main(libllama: str) -> None:
    lib = ctypes.CDLL(libllama)

    class Message(ctypes.Structure):
        _fields_ = [("role", ctypes.c_char_p), ("content", ctypes.c_char_p)]

    apply = lib.llama_chat_apply_template
    apply.argtypes = [ctypes.c_char_p, ctypes.POINTER(Message), ctypes.c_size_t, ctypes.c_bool,
                      ctypes.c_char_p, ctypes.c_int32]
    apply.restype = ctypes.c_int32
    listing = lib.llama_chat_builtin_templates
    listing.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t]
    n = listing(None, 0)
    names = (ctypes.c_char_p * n)()
    listing(names, n)

    renders = {}
    for raw_name in names:
        name = raw_name.decode()
        renders[name] = []
        for i, conversation in enumerate(CONVERSATIONS):
            chat = (Message * max(1, len(conversation)))(
                *[Message(m["role"].encode(), m["content"].encode()) for m in conversation])
            for add_generation_prompt in (True, False):
                size = apply(raw_name, chat, len(conversation), add_generation_prompt, None, 0)
                if size < 0:
                    raise SystemExit(f"llama_chat_apply_template({name}) failed: {size}")
                buf = ctypes.create_string_buffer(size + 1)
                apply(raw_name, chat, len(conversation), add_generation_prompt, buf, size + 1)
                renders[name].append({"conversation": i,
                                      "add_generation_prompt": add_generation_prompt,
                                      "prompt": buf.raw[:size].decode("utf-8")})
    out = pathlib.Path(__file__).with_name("llama_cpp_chat_builtin.json")
    out.write_text(json.dumps({"llama_cpp": "libllama.so 0.6.0 (llama_chat_apply_template)",
                               "conversations": CONVERSATIONS, "renders": renders},
                              ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"{len(renders)} templates × {len(CONVERSATIONS)} conversations → {out}")


if __name__ == "__main__":
    main(sys.argv[1])
