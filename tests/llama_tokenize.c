// llama.cpp's tokenizer on a vocabulary-only GGUF: tests/record_o200k_tokens.py runs it to
// record tests/golden/llama_cpp_o200k_harmony.json.
//
// Build (once) against a llama.cpp build tree:
//   L=/path/to/llama.cpp
//   gcc -O1 tests/llama_tokenize.c -I$L/include -I$L/ggml/include -L$L/build/bin -lllama \
//       -Wl,-rpath,$L/build/bin -o /tmp/llama_tokenize
//
// Usage: llama_tokenize VOCAB.gguf TEXTS PARSE_SPECIAL(0|1)
// TEXTS holds texts separated by "\n__ggml_vocab_test__\n" (llama.cpp's .inp files); one line
// of space-separated ids per text is printed (llama_tokenize with add_special = false).
#include "llama.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char SEPARATOR[] = "\n__ggml_vocab_test__\n";

int main(int argc, char ** argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s VOCAB.gguf TEXTS PARSE_SPECIAL\n", argv[0]);
        return 2;
    }
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    struct llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        return 1;
    }
    const struct llama_vocab * vocab = llama_model_get_vocab(model);
    FILE * f = fopen(argv[2], "rb");
    if (!f) {
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char * data = malloc(size + 1);
    if (fread(data, 1, size, f) != (size_t) size) {
        return 1;
    }
    data[size] = 0;
    fclose(f);
    int parse_special = atoi(argv[3]);
    int cap = 1 << 20;
    llama_token * ids = malloc(sizeof(llama_token) * cap);
    char * pos = data;
    char * end = data + size;
    while (pos <= end) {
        char * next = strstr(pos, SEPARATOR);
        int len = next ? (int) (next - pos) : (int) (end - pos);
        int n = llama_tokenize(vocab, pos, len, ids, cap, false, parse_special);
        for (int i = 0; i < n; i++) {
            printf(i ? " %d" : "%d", ids[i]);
        }
        printf("\n");
        if (!next) {
            break;
        }
        pos = next + strlen(SEPARATOR);
    }
    llama_model_free(model);
    return 0;
}
