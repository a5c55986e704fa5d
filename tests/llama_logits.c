/* llama.cpp's logits at every position of a token sequence, for tests/record_synthetic_logits.py
 * where llama-cpp-python is not installed (or its bundled llama.cpp predates a family): built
 * against the llama.cpp it records, never by the test suite.
 *
 *   LCPP=path/to/llama.cpp   # its build/bin holds libllama.so (-DBUILD_SHARED_LIBS=ON)
 *   gcc -O2 tests/llama_logits.c -I$LCPP/include -I$LCPP/ggml/include \
 *       -L$LCPP/build/bin -Wl,-rpath,$LCPP/build/bin -lllama -o /tmp/llama_logits
 *   /tmp/llama_logits MODEL N_CTX N_THREADS TOKENS_FILE OUT_FILE [N_TURNS]
 *
 * TOKENS_FILE: int32 token ids; OUT_FILE gets float32 logits, n_tokens rows of n_vocab. The ids
 * are decoded as one sequence in N_TURNS llama_decode calls of equal size (default 1: one
 * batch), each asking for every position's logits; the context's other parameters are
 * llama_context_default_params' (F16 KV cache, flash attention as llama.cpp decides).
 */
#include <stdio.h>
#include <stdlib.h>

#include "llama.h"

static void quiet(enum ggml_log_level level, const char *text, void *user) {
    (void)user;
    if (level >= GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: %s MODEL N_CTX N_THREADS TOKENS_FILE OUT_FILE [N_TURNS]\n", argv[0]);
        return 2;
    }
    int n_ctx = atoi(argv[2]), n_threads = atoi(argv[3]);
    int n_turns = argc > 6 ? atoi(argv[6]) : 1;

    FILE *f = fopen(argv[4], "rb");
    if (!f) { perror(argv[4]); return 1; }
    fseek(f, 0, SEEK_END);
    int n_tokens = (int)(ftell(f) / sizeof(llama_token));
    fseek(f, 0, SEEK_SET);
    llama_token *tokens = malloc(n_tokens * sizeof(llama_token));
    if (fread(tokens, sizeof(llama_token), n_tokens, f) != (size_t)n_tokens) { perror("read"); return 1; }
    fclose(f);

    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "cannot load %s\n", argv[1]); return 1; }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = cp.n_ubatch = n_tokens;
    cp.n_threads = cp.n_threads_batch = n_threads;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "cannot make a context\n"); return 1; }
    int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    FILE *out = fopen(argv[5], "wb");
    if (!out) { perror(argv[5]); return 1; }
    struct llama_batch batch = llama_batch_init(n_tokens, 0, 1);
    int per_turn = (n_tokens + n_turns - 1) / n_turns;
    for (int start = 0; start < n_tokens; start += per_turn) {
        int n = start + per_turn <= n_tokens ? per_turn : n_tokens - start;
        batch.n_tokens = n;
        for (int i = 0; i < n; i++) {
            batch.token[i] = tokens[start + i];
            batch.pos[i] = start + i;
            batch.n_seq_id[i] = 1;
            batch.seq_id[i][0] = 0;
            batch.logits[i] = 1;
        }
        if (llama_decode(ctx, batch) != 0) { fprintf(stderr, "llama_decode failed\n"); return 1; }
        for (int i = 0; i < n; i++) fwrite(llama_get_logits_ith(ctx, i), sizeof(float), n_vocab, out);
    }
    fclose(out);
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
