// What llama.cpp's common/chat.cpp makes of a chat: the prompt it renders and how it parses
// replies. Reads one JSON request on stdin, writes one JSON answer on stdout; used by
// tests/record_chat_formats.py to record tests/golden/llama_cpp_chat_formats.json.
//
// Build (once) against a llama.cpp build tree (headers + build/bin's libraries):
//   L=/path/to/llama.cpp
//   g++ -std=c++17 -O1 tests/llama_chat.cpp -I$L/common -I$L/include -I$L/ggml/include -I$L/vendor \
//       -L$L/build/bin -lllama-common -lllama -lggml -lggml-base -Wl,-rpath,$L/build/bin -o /tmp/llama_chat
//
// Request: {"template": jinja source, "messages": [...], "tools": [...], "tool_choice": "auto",
//           "parallel_tool_calls": false, "reasoning_format": "auto", "enable_thinking": true,
//           "kwargs": {name: value}, "outputs": [generated text, ...]}
// Answer:  {"prompt", "generation_prompt", "format", "thinking_start_tag", "thinking_end_tags",
//           "preserved_tokens", "grammar_lazy", "parsed": [OpenAI message per output]}
#include "chat.h"
#include "json.h"

#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>

using json = nlohmann::ordered_json;

int main() {
    std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    json req = json::parse(input);

    auto tmpls = common_chat_templates_init(nullptr, req.at("template").get<std::string>(),
                                            req.value("bos_token", std::string()),
                                            req.value("eos_token", std::string()));
    common_chat_templates_inputs inputs;
    inputs.messages = common_chat_msgs_parse_oaicompat(common_json::parse(req.at("messages").dump()));
    if (req.contains("tools")) {
        inputs.tools = common_chat_tools_parse_oaicompat(common_json::parse(req.at("tools").dump()));
    }
    inputs.tool_choice = common_chat_tool_choice_parse_oaicompat(req.value("tool_choice", std::string("auto")));
    inputs.parallel_tool_calls = req.value("parallel_tool_calls", false);
    inputs.reasoning_format = common_reasoning_format_from_name(req.value("reasoning_format", std::string("auto")));
    inputs.enable_thinking = req.value("enable_thinking", true);
    inputs.add_generation_prompt = req.value("add_generation_prompt", true);
    if (req.contains("kwargs")) {
        for (const auto & [k, v] : req.at("kwargs").items()) {
            inputs.chat_template_kwargs[k] = v.dump();
        }
    }
    auto params = common_chat_templates_apply(tmpls.get(), inputs);

    common_chat_parser_params pp(params);
    pp.reasoning_format = inputs.reasoning_format;
    pp.parse_tool_calls = !inputs.tools.empty() && inputs.tool_choice != COMMON_CHAT_TOOL_CHOICE_NONE;
    if (!params.parser.empty()) {
        pp.parser.load(params.parser);
    }
    json parsed = json::array();
    for (const auto & out : req.value("outputs", json::array())) {
        try {
            auto msg = common_chat_parse(out.get<std::string>(), false, pp);
            parsed.push_back(json::parse(msg.to_json_oaicompat().dump()));
        } catch (const std::exception & e) {
            parsed.push_back(json{{"error", e.what()}});
        }
    }
    json answer = {
        {"prompt", params.prompt},
        {"generation_prompt", params.generation_prompt},
        {"format", common_chat_format_name(params.format)},
        {"thinking_start_tag", params.thinking_start_tag},
        {"thinking_end_tags", params.thinking_end_tags},
        {"preserved_tokens", params.preserved_tokens},
        {"grammar_lazy", params.grammar_lazy},
        {"parsed", parsed},
    };
    std::cout << answer.dump() << std::endl;
    return 0;
}
