"""What every model family shares, so that a family's file holds only what makes it different.

- `Architecture`: the interface a family implements (hyperparameter hook, weights, forward).
- `WeightLoader`: takes each tensor a family names from the file, checked against the
  hyperparameters (present, right number of dimensions, right shape, a type the kernels
  compute) before anything is allocated, and hands it to the backend of its layer.
- `Transformer`: the decoder block most families share — llama.cpp's `llm_build_llama` shape
  (src/models/llama.cpp): pre-norm attention and a gated FFN, each added to the residual stream —
  with the optional pieces other families add when their file has them: a fused `attn_qkv`
  (Phi 3; llama.cpp's create_tensor_qkv/build_qkv take it in every family), Q/K/V/O biases
  (Qwen 2), per-head or whole-vector Q/K RMS norms (Qwen 3, Gemma 3, OLMo 2), post-attention and
  post-FFN norms (Gemma 2/3, OLMo 2), attention sinks (gpt-oss), Llama 3.1's `rope_freqs` or
  LongRoPE's long/short factors, attention logit soft-capping (Gemma 2), tied output, final logit
  soft-capping.
  A family subclasses it and overrides the hooks (`read_hparams`, `layer_rope`, `load_layer`,
  `embedding_scale`, `project_qkv`, `ffn`, `add_residual`, `final_norm`, `head`, ...).
  Embeddings (llama.cpp's `--embeddings`) pool `final_norm`'s output, so a family whose final
  norm differs overrides that hook, not only `head`.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

from ..backend import DecoderLayer
from ..hparams import HParams, Meta, ModelMetadataError
from ..quants import kernels_of

__all__ = ["Architecture", "Transformer", "Weights", "WeightLoader"]


class Architecture(ABC):
    """One model family: its own hyperparameters, its weights, its forward pass."""

    name = ""
    # a decode step can be captured in a CUDA graph (cuda/graphs.py): not when the forward
    # pass decides on the host what the device does next (MoE routing)
    graph_capturable = True

    def read_hparams(self, meta: Meta, hp: HParams) -> None:
        """Reads the family's own metadata into `hp` (hp.extra for values only it uses) and
        checks what it cannot run; the shared keys are already read."""

    def layer_rope(self, hp: HParams, il: int, n_ctx: int):
        """How layer il rotates Q and K in a context of n_ctx cells (a rope.RopeSpec), or None
        for a layer without RoPE. The model keeps one per layer: attention and the KV cache's
        position shift use the same."""
        return hp.layer_rope(il, n_ctx)

    @abstractmethod
    def load_weights(self, loader: "WeightLoader", hp: HParams):
        """The weights, each checked and prepared by the backend of its layer."""

    @abstractmethod
    def forward(self, ctx, weights) -> np.ndarray:
        """Logits float32 (len(ctx.out_rows), n_vocab) for the micro-batch; with
        `ctx.embeddings` (an EmbeddingContext) every token's hidden state after the final norm
        instead, float32 (n_tokens, n_embd): what llama.cpp pools into embeddings (t_embd)."""

    def greedy_on_device(self, hp: HParams) -> bool:
        """Whether the forward pass can return the greedy token of each output row instead of
        its logits, when the context asks (ForwardContext.greedy); see Transformer."""
        return False

    def recurrent_rows(self, hp: HParams):
        """What the family's recurrent layers keep per sequence (a recurrent.RecurrentRows:
        the model's memory is then a HybridCache), or None: attention layers only."""
        return None

    def max_positions(self, hp: HParams) -> int | None:
        """The most positions a sequence may have (a table of absolute position embeddings has
        a row per position); None: no limit but the context."""
        return None

    def kv_shape(self, hp: HParams, il: int) -> tuple[int, int, int]:
        """What layer il's cache keeps per cell: (n_head_kv, head_dim_k, head_dim_v)
        (llama_hparams::n_embd_k_gqa(il) / n_embd_v_gqa(il) by heads)."""
        return hp.n_head_kv, hp.head_dim_k, hp.head_dim_v

    def kv_source(self, hp: HParams, il: int) -> int:
        """The layer whose K and V rows layer il attends over: il itself, or an earlier layer
        whose cache it reuses, storing none of its own (llama_kv_cache's layer_reuse_cb)."""
        return il


# ----------------------------------------------------------------------------- loading weights


class WeightLoader:
    """Hands out a model's tensors by name, each checked first: present (unless optional), the
    number of dimensions and the shape the hyperparameters imply, a type the kernels compute.
    Errors are ModelMetadataError naming the tensor, what it is and what was expected."""

    def __init__(self, gguf, model):
        self.gguf = gguf
        self.model = model

    def _tensor(self, name: str, shape: tuple[int, ...], optional: bool):
        t = self.gguf.tensors.get(name)
        if t is None:
            if optional:
                return None
            raise ModelMetadataError(f"the model lacks tensor {name!r}")
        if tuple(t.shape) != shape:
            raise ModelMetadataError(f"tensor {name!r} has shape {tuple(t.shape)}: expected "
                                     f"{shape} from the hyperparameters")
        return t

    def matrix(self, name: str, n_out: int, n_in: int, il: int = -1, optional: bool = False):
        """A weight matrix (n_out rows of n_in) for the backend of layer `il` (-1: the input
        embedding, n_layer: the output head)."""
        t = self._computable(self._tensor(name, (n_out, n_in), optional))
        return None if t is None else self.model.backend_for(il).weight(t)

    def experts(self, name: str, n_expert: int, n_out: int, n_in: int, il: int,
                optional: bool = False):
        """A 3-D tensor of expert matrices (n_expert matrices of n_out rows of n_in: ffn_up_exps,
        say) for the backend of layer `il`."""
        t = self._computable(self._tensor(name, (n_expert, n_out, n_in), optional))
        return None if t is None else self.model.backend_for(il).experts(t)

    @staticmethod
    def _computable(t):
        # the types with CPU kernels (registered when the model's CPU backend was imported):
        # every layer can run there
        computed = kernels_of("cpu")
        if t is not None and t.type not in computed:
            raise ModelMetadataError(
                f"tensor {t.name!r} has type {t.type}, which this engine cannot compute "
                f"(it computes {', '.join(sorted(computed))})")
        return t

    def vector(self, name: str, n: int, il: int = -1, optional: bool = False):
        """A 1-D tensor of n values (a norm's weight, a bias) as the backend of layer `il` keeps
        it."""
        t = self._host_vector(name, n, optional)
        return None if t is None else self.model.backend_for(il).vector(t)

    def host_vector(self, name: str, n: int, optional: bool = False) -> np.ndarray | None:
        """A 1-D tensor as a float32 numpy array (for tables computed on the host)."""
        t = self._host_vector(name, n, optional)
        return None if t is None else \
            np.ascontiguousarray(t.dequantize(), dtype=np.float32).reshape(-1)

    def _host_vector(self, name, n, optional):
        t = self._tensor(name, (n,), optional)
        if t is not None and t.type not in ("F32", "F16", "BF16"):
            raise ModelMetadataError(f"tensor {name!r} has type {t.type}: expected F32, F16 or "
                                     f"BF16 for a vector")
        return t

    def layer(self, il: int) -> "LayerTensors":
        return LayerTensors(self, il)


class LayerTensors:
    """The tensors `blk.{il}.*` of one layer, for its backend: names are given without the
    `blk.{il}.` prefix."""

    def __init__(self, loader: WeightLoader, il: int):
        self.loader, self.il = loader, il

    def matrix(self, name: str, n_out: int, n_in: int, optional: bool = False):
        return self.loader.matrix(f"blk.{self.il}.{name}", n_out, n_in, self.il, optional)

    def vector(self, name: str, n: int, optional: bool = False):
        return self.loader.vector(f"blk.{self.il}.{name}", n, self.il, optional)

    def experts(self, name: str, n_expert: int, n_out: int, n_in: int, optional: bool = False):
        return self.loader.experts(f"blk.{self.il}.{name}", n_expert, n_out, n_in, self.il,
                                   optional)

    def host_vector(self, name: str, n: int, optional: bool = False):
        return self.loader.host_vector(f"blk.{self.il}.{name}", n, optional)


@dataclass
class Weights:
    tok_embd: object
    output_norm: object
    output: object
    layers: list
    extra: dict = field(default_factory=dict)


# ----------------------------------------------------------------------------- the decoder block


class Transformer(Architecture):
    """llama.cpp's common decoder: x = embed(tokens); per layer
        x = x + post_attn_norm(wo · attention(rope(q), rope(k), v))     (q, k, v from attn_norm(x))
        x = x + post_ffw_norm(ffn(ffn_norm(x)))
    and logits = output · output_norm(x); the norms a file lacks are skipped."""

    ffn_activation = "silu"  # the gated FFN's activation: "silu" (SwiGLU) or "gelu" (GeGLU)
    scale_q_first = False  # scale Q by kq_scale before attention (Gemma's ggml_scale of Qcur)
    # the RoPE scaling types this family's forward honours (HParams.layer_rope gives every
    # family llama.cpp's RoPE, YaRN included)
    rope_scalings = ("none", "linear", "yarn", "longrope")
    # rope_factors_long/short are read whatever rope.scaling.type says (Phi 3); others read them
    # only with type longrope, and rope_freqs otherwise (llama.cpp's load_arch_tensors)
    longrope_factors_always = False
    # the optional tensors of the shared block (names under blk.N.) that this family requires
    required = frozenset(("attn_norm.weight", "ffn_norm.weight"))

    # ------------------------------------------------------------------ hyperparameters

    def read_hparams(self, meta: Meta, hp: HParams) -> None:
        if hp.rope_scaling not in self.rope_scalings:
            raise ModelMetadataError(
                f"{meta.key('rope.scaling.type')} = {hp.rope_scaling!r} is not supported for "
                f"{self.name} (supported: {', '.join(self.rope_scalings)})")
        if hp.n_ff <= 0 and not hp.n_expert:
            raise ModelMetadataError(f"GGUF metadata lacks {meta.key('feed_forward_length')}")

    # ------------------------------------------------------------------ weights

    def load_weights(self, loader: WeightLoader, hp: HParams) -> Weights:
        self.load_rope_factors(loader, hp)
        layers = [self.load_layer(loader.layer(il), hp) for il in range(hp.n_layer)]
        return Weights(tok_embd=loader.matrix("token_embd.weight", hp.n_vocab, hp.n_embd, -1),
                       layers=layers, **self.load_head(loader, hp))

    def load_rope_factors(self, loader: WeightLoader, hp: HParams) -> None:
        """The per-pair RoPE frequency factors the file has (llama.cpp's rope_freqs, or
        rope_long / rope_short for LongRoPE); HParams.rope_factors picks among them."""
        n = hp.n_rot // 2
        if self.longrope_factors_always or hp.rope_scaling == "longrope":
            hp.rope_factors_long = loader.host_vector("rope_factors_long.weight", n, optional=True)
            hp.rope_factors_short = loader.host_vector("rope_factors_short.weight", n,
                                                       optional=True)
        else:
            hp.rope_freq_factors = loader.host_vector("rope_freqs.weight", n, optional=True)

    def load_layer(self, t: LayerTensors, hp: HParams) -> SimpleNamespace:
        """One layer's tensors; a family overrides to add or replace some."""
        q_out, kv_out = hp.n_head * hp.head_dim_k, hp.n_head_kv * hp.head_dim_k
        v_out, att_out = hp.n_head_kv * hp.head_dim_v, hp.n_head * hp.head_dim_v
        e = hp.n_embd

        def opt(name, n):
            return t.vector(name, n, optional=name not in self.required)

        # llama.cpp's create_tensor_qkv: one fused matrix (Q rows, then K, then V) when the file
        # has it, else three
        wqkv = t.matrix("attn_qkv.weight", q_out + kv_out + v_out, e, optional=True)
        separate = wqkv is None
        return SimpleNamespace(
            attn_norm=opt("attn_norm.weight", e),
            wqkv=wqkv,
            bqkv=opt("attn_qkv.bias", q_out + kv_out + v_out),
            wq=t.matrix("attn_q.weight", q_out, e) if separate else None,
            wk=t.matrix("attn_k.weight", kv_out, e) if separate else None,
            wv=t.matrix("attn_v.weight", v_out, e) if separate else None,
            wo=t.matrix("attn_output.weight", e, att_out),
            bq=opt("attn_q.bias", q_out),
            bk=opt("attn_k.bias", kv_out),
            bv=opt("attn_v.bias", v_out),
            bo=opt("attn_output.bias", e),
            sinks=opt("attn_sinks.weight", hp.n_head),
            q_norm=self._qk_norm(t, "attn_q_norm.weight", hp.head_dim_k, q_out),
            k_norm=self._qk_norm(t, "attn_k_norm.weight", hp.head_dim_k, kv_out),
            post_attn_norm=opt("post_attention_norm.weight", e),
            ffn_norm=opt("ffn_norm.weight", e),
            **self.load_ffn(t, hp),
            post_ffw_norm=opt("post_ffw_norm.weight", e),
        )

    def load_ffn(self, t: LayerTensors, hp: HParams) -> dict:
        e, f = hp.n_embd, hp.n_ff
        return dict(w_gate=t.matrix("ffn_gate.weight", f, e), w_up=t.matrix("ffn_up.weight", f, e),
                    w_down=t.matrix("ffn_down.weight", e, f))

    def _qk_norm(self, t: LayerTensors, name: str, per_head: int, whole: int):
        """A Q/K RMS norm weight: per head (Qwen 3, Gemma) or over the whole projection
        (OLMo 2); None when the file has none."""
        tensor = t.loader.gguf.tensors.get(f"blk.{t.il}.{name}")
        size = whole if tensor is not None and tuple(tensor.shape) == (whole,) else per_head
        return t.vector(name, size, optional=name not in self.required)

    def load_head(self, loader: WeightLoader, hp: HParams) -> dict:
        """The final norm and the output matrix (token_embd when the file ties them)."""
        head = hp.n_layer
        output = loader.matrix("output.weight", hp.n_vocab, hp.n_embd, head, optional=True)
        if output is None:  # tied embeddings
            output = loader.matrix("token_embd.weight", hp.n_vocab, hp.n_embd, head)
        return dict(output_norm=loader.vector("output_norm.weight", hp.n_embd, head),
                    output=output)

    # ------------------------------------------------------------------ forward

    def forward(self, ctx, w: Weights) -> np.ndarray:
        x = self.embed(ctx, w)
        per_layer = self.per_layer_inputs(ctx, w, x)
        fused = self.fused_blocks(ctx, w) if per_layer is None and not ctx.embeddings else ()
        for il, layer in enumerate(w.layers):
            x = ctx.backend(il).take(x)
            block = fused[il] if fused else None
            if block is not None and ctx.n_tokens <= block.max_tokens \
                    and ctx.keep_rows(il) is None:
                x = block(ctx, x)
                continue
            extra = () if per_layer is None else (per_layer[:, il],)
            x = self.block(ctx, il, layer, x, *extra)
            if x is None:  # no row wants logits
                return np.empty((0, ctx.hp.n_vocab), np.float32)
        if ctx.embeddings:
            be = ctx.backend(ctx.hp.n_layer)
            return be.to_host(self.final_norm(ctx, w, be.take(x)))
        return self.head(ctx, w, x)

    # the hooks of the block whose defaults a backend's fused decode step reproduces
    # (Backend.fused_block): a family overriding any of them runs its blocks op by op
    _FUSED_HOOKS = ("block", "attention", "project_qkv", "_qk", "ffn", "gated_ffn", "activate",
                    "add_residual", "norm")
    # the optional pieces of a layer the fused step does not take
    _UNFUSED_PIECES = ("wqkv", "bqkv", "bo")

    def fused_blocks(self, ctx, w: Weights) -> list:
        """Each layer's fused decode step (Backend.fused_block) or None, found at the first
        batch and kept with the weights."""
        blocks = w.extra.get("fused_blocks")
        if blocks is None:
            blocks = w.extra["fused_blocks"] = [self.fused_block(ctx, il, L)
                                                for il, L in enumerate(w.layers)]
        return blocks

    def fused_block(self, ctx, il: int, L):
        """Layer il as a DecoderLayer for its backend's fused step, where it is one: the
        family keeps the block's defaults and the layer has none of the pieces it lacks (Q/K
        norms are per head)."""
        cls, hp = type(self), ctx.hp
        if cls.ffn_activation not in ("silu", "gelu") or any(
                getattr(cls, hook) is not getattr(Transformer, hook) for hook in self._FUSED_HOOKS):
            return None
        norms = [getattr(L, name, None) for name in ("q_norm", "k_norm")]
        if any(norm is not None and norm.shape[0] != hp.head_dim_k for norm in norms) \
                or any(getattr(L, piece, None) is not None for piece in self._UNFUSED_PIECES) \
                or getattr(L, "w_gate", None) is None or L.attn_norm is None \
                or L.ffn_norm is None or self.kv_source(hp, il) != il:
            return None
        be = ctx.backend(il)
        if ctx.model.kv_backends[il] is not be:
            return None
        n_head_kv, head_dim_k, head_dim_v = self.kv_shape(hp, il)
        q_scale, kq_scale = (hp.kq_scale, 1.0) if cls.scale_q_first else (1.0, hp.kq_scale)
        piece = lambda name: getattr(L, name, None)  # noqa: E731 (a family's layers may lack it)
        layer = DecoderLayer(
            il, L.attn_norm, L.wq, L.wk, L.wv, piece("bq"), piece("bk"), piece("bv"), *norms,
            L.wo, piece("post_attn_norm"), L.ffn_norm, L.w_gate, L.w_up, L.w_down,
            piece("post_ffw_norm"), cls.ffn_activation, piece("sinks"), hp.n_head, n_head_kv,
            head_dim_k, head_dim_v, hp.rms_eps, q_scale, kq_scale, hp.attn_logit_softcap,
            ctx.rope(il))
        return be.fused_block(layer, (ctx.kv.type_k, ctx.kv.type_v))

    def greedy_on_device(self, hp: HParams) -> bool:
        """Whether `head` can hand back greedy tokens (ctx.greedy): the argmax of the logits as
        the output matrix gives them. Not when the host changes them after the download: a
        final soft-cap, or a family's own head (Granite's scale), whose roundings can tie or
        part two logits."""
        return not hp.final_logit_softcap and type(self).head is Transformer.head

    def per_layer_inputs(self, ctx, w: Weights, x):
        """(n, n_layer, width) inputs each block takes beside the residual stream (Gemma 4's
        per-layer token embeddings), or None: most families have none."""
        return None

    def embed(self, ctx, w: Weights):
        be = ctx.backend(-1)
        x = be.get_rows(w.tok_embd, ctx.tokens)
        scale = self.embedding_scale(ctx.hp)
        return x if scale == 1.0 else be.scale(x, scale)

    def embedding_scale(self, hp: HParams) -> float:
        """What the token embeddings are multiplied by (Gemma's sqrt(n_embd), Granite's
        embedding_scale)."""
        return 1.0

    def block(self, ctx, il: int, L, x):
        hp, be = ctx.hp, ctx.backend(il)
        h = self.norm(be, x, L.attn_norm, hp)
        a = self.attention(ctx, il, L, h)
        rows = ctx.keep_rows(il)
        if rows is not None:  # the last layer: only the rows that want logits go on
            if rows.size == 0:
                return None
            a, x = a[rows], x[rows]
        a = self.norm(be, _linear(be, L.wo, a, L.bo), L.post_attn_norm, hp)
        x = self.add_residual(be, x, a, hp)
        f = self.ffn(ctx, il, L, self.norm(be, x, L.ffn_norm, hp))
        return self.add_residual(be, x, self.norm(be, f, L.post_ffw_norm, hp), hp)

    def add_residual(self, be, x, y, hp: HParams):
        """x + y: a sublayer's output y added to the residual stream x."""
        return be.add(x, y)

    @staticmethod
    def norm(be, x, weight, hp: HParams):
        return x if weight is None else be.rms_norm(x, weight, hp.rms_eps)

    def attention(self, ctx, il: int, L, h):
        """Q, K, V of the layer's input, rotated, attended over the cache: (n, n_head·d_v)."""
        hp, be = ctx.hp, ctx.backend(il)
        q, k, v = self.project_qkv(ctx, il, L, h)
        rope = ctx.rope(il)
        if rope is not None:
            q = be.rope(q, ctx.positions, rope)
            k = be.rope(k, ctx.positions, rope)
        # (a family that builds its own layers may have no sinks field)
        softcap, sinks = hp.attn_logit_softcap, getattr(L, "sinks", None)
        if self.scale_q_first:
            return ctx.attend(il, be.scale(q, hp.kq_scale), k, v, 1.0, softcap, sinks)
        return ctx.attend(il, q, k, v, hp.kq_scale, softcap, sinks)

    def project_qkv(self, ctx, il: int, L, h):
        """(q, k, v) as (n, heads, head_dim), biases added and Q/K norms applied."""
        hp, be, n = ctx.hp, ctx.backend(il), ctx.n_tokens
        if L.wqkv is None:
            q, k, v = be.matmul_many((L.wq, L.wk, L.wv), h)
            q, k, v = (_add_bias(be, q, L.bq), _add_bias(be, k, L.bk), _add_bias(be, v, L.bv))
        else:  # build_qkv's views of the fused product; separate biases may come with it
            qkv = _linear(be, L.wqkv, h, L.bqkv)
            q_out, kv_out = hp.n_head * hp.head_dim_k, hp.n_head_kv * hp.head_dim_k
            q, k, v = qkv[:, :q_out], qkv[:, q_out:q_out + kv_out], qkv[:, q_out + kv_out:]
            q, k, v = (_add_bias(be, q, L.bq), _add_bias(be, k, L.bk), _add_bias(be, v, L.bv))
        q = self._qk(be, q, L.q_norm, n, hp.n_head, hp)
        k = self._qk(be, k, L.k_norm, n, hp.n_head_kv, hp)
        return q, k, v.reshape(n, hp.n_head_kv, hp.head_dim_v)

    @staticmethod
    def _qk(be, x, norm, n: int, n_head: int, hp: HParams):
        if norm is not None and norm.shape[0] != hp.head_dim_k:  # over the whole projection
            x = be.rms_norm(x, norm, hp.rms_eps)
            norm = None
        x = x.reshape(n, n_head, hp.head_dim_k)
        return x if norm is None else be.rms_norm(x, norm, hp.rms_eps)

    def ffn(self, ctx, il: int, L, h):
        """The gated FFN: down(act(gate · h) * (up · h))."""
        return self.gated_ffn(ctx.backend(il), L.w_gate, L.w_up, L.w_down, h)

    def gated_ffn(self, be, w_gate, w_up, w_down, h):
        """llm_build_ffn with LLM_FFN_PAR: down(act(gate · h) * (up · h))."""
        gate, up = be.matmul_many((w_gate, w_up), h)
        return be.matmul(w_down, self.activate(be, gate, up))

    def activate(self, be, gate, up):
        """The gated activation of the family's FFNs: act(gate) * up."""
        return be.swiglu(gate, up) if self.ffn_activation == "silu" else be.geglu(gate, up)

    def final_norm(self, ctx, w: Weights, x):
        """The last layer's output normalized (llama.cpp's result_norm): what the output matrix
        reads, and what embeddings pool."""
        return ctx.backend(ctx.hp.n_layer).rms_norm(x, w.output_norm, ctx.hp.rms_eps)

    def head(self, ctx, w: Weights, x) -> np.ndarray:
        """Logits of the output rows: output · final_norm(x), soft-capped when the model says.
        With `ctx.greedy` (greedy_on_device) their greedy tokens instead, int32 (n,), sampled
        where the logits are (Backend.greedy_tokens)."""
        hp = ctx.hp
        be = ctx.backend(hp.n_layer)
        x = self.final_norm(ctx, w, be.take(x))
        logits = be.matmul(w.output, x)
        if ctx.greedy:
            return be.to_host(be.greedy_tokens(logits))
        logits = be.to_host(logits)
        if hp.final_logit_softcap:  # ggml_scale by 1/cap, ggml_tanh, ggml_scale by cap
            c = np.float32(hp.final_logit_softcap)
            logits = np.tanh(logits * (np.float32(1.0) / c)) * c
        return logits


def _linear(be, weight, x, bias):
    return _add_bias(be, be.matmul(weight, x), bias)


def _add_bias(be, y, bias):
    return y if bias is None else be.add(y, bias)

