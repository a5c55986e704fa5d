"""`llamatui tokenize -m MODEL TEXT`: the token ids of a text, as llama-tokenize --ids prints."""
from llamatui.models.store import resolve_model


def add_arguments(p):
    p.add_argument("-m", "--model", required=True, help="GGUF file, or a model name in the store")
    p.add_argument("--no-bos", action="store_true",
                   help="do not add the BOS/EOS tokens the model's tokenizer adds")
    p.add_argument("--parse-special", action="store_true",
                   help="turn special-token text such as <|im_start|> into its token")
    p.add_argument("--pieces", action="store_true", help="print 'id -> piece' lines")
    p.add_argument("text", help="the text to tokenize")


def run(args):
    from llamatui.inference import GGUFFile, Tokenizer  # numba: loaded only when needed
    with GGUFFile.open(resolve_model(args.model)) as f:  # the vocabulary only, no weights
        tok = Tokenizer.from_metadata(f.metadata)
    ids = tok.encode(args.text, add_special=not args.no_bos, parse_special=args.parse_special)
    if args.pieces:
        for i in ids:
            print(f"{i:6d} -> {tok.token_to_piece(i).decode('utf-8', 'replace')!r}")
    else:
        print(ids)
