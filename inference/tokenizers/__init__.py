"""Tokenizers: llama.cpp's vocabularies rebuilt from a GGUF file's metadata.

- `tokenizer`: Tokenizer, built with `Tokenizer.from_metadata(metadata)`; picks one of
  `bpe` (GPT-2 style byte-level BPE), `spm` (SentencePiece), `ugm` (Unigram, T5) or
  `wpm` (WordPiece, BERT), with `special` (special-token splitting) and `vocab` (token tables).
"""
