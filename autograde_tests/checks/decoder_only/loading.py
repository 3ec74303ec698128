"""Chapter 6's load_hf_llama and load_meta_llama: their cases, their mistakes and their checks.

load_hf_llama's catalogued mistakes: the weights transposed; the head left as it was when the checkpoint has
none (tied), or taken from the embedding when it has one; q_proj and k_proj reordered as Meta's are; the two
norms swapped; the model's parameters replaced by the checkpoint's tensors; the checkpoint changed; the model not
returned.

load_meta_llama's: wq and wk not reordered; wv (and wo) reordered too; only wq reordered; the reordering the wrong
way round; across all the heads at once; wk reordered with the query heads' count; w1 and w3 swapped; and those
of load_hf_llama that apply.

The loaders load into a stand-in with a GPT's parameters (``stand_in_models.load_target``), whose weights the
check reads back and judges by a reference GPT's logits.
"""

import functools
from dataclasses import dataclass

import torch

from ...reference import decoder_only as ref
from ...remote.proxy import make_in_kernel, run_in_kernel
from .. import in_kernel, stand_in_models
from ..harness import (
    CheckFailed,
    Mistake,
    SeededRandom,
    candidates,
    close,
    edited,
    fail,
    learner_step,
    matching_mistake,
    name_the_mistake,
    one_thread,
    randomise,
    restate,
    run_cases,
    seed_for,
    strict_numerics,
)
from ..how import kernel_reported


@dataclass(frozen=True)
class LoadCase:
    vocab: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    n_layers: int
    d_ff: int
    tied: bool  # the checkpoint holds no head (lm_head.weight, output.weight): the head is the embedding
    stored: torch.dtype | None = None  # the checkpoint's dtype (bfloat16, as published ones are), None: the model's


# d_k of 6 and more (with 4, Meta's reordering is its own inverse); one head and several; grouped-query heads, where
# d_k / (n_heads / n_kv_heads) is even (so that wk reordered in groups of that size is a mistake of its own).
VISIBLE_LOAD = [LoadCase(11, 16, 2, 2, 2, 24, tied=False), LoadCase(9, 32, 4, 2, 1, 40, tied=True)]
HIDDEN_LOAD = [LoadCase(13, 32, 4, 1, 2, 48, tied=False, stored=torch.bfloat16),
               LoadCase(10, 24, 4, 4, 3, 36, tied=True), LoadCase(7, 16, 1, 1, 2, 20, tied=False),
               LoadCase(12, 48, 4, 2, 1, 64, tied=True, stored=torch.bfloat16)]
LOADED_IDX = (2, 7)  # the tokens whose logits judge a load
HF_NAMES = {"embed": "model.embed_tokens", "norm": "model.norm", "head": "lm_head", "attn_norm": "input_layernorm",
            "ffn_norm": "post_attention_layernorm", "w_q": "self_attn.q_proj", "w_k": "self_attn.k_proj",
            "w_v": "self_attn.v_proj", "w_o": "self_attn.o_proj", "w_gate": "mlp.gate_proj", "w_up": "mlp.up_proj",
            "w_down": "mlp.down_proj", "blocks": "model.layers"}
META_NAMES = {"embed": "tok_embeddings", "norm": "norm", "head": "output", "attn_norm": "attention_norm",
              "ffn_norm": "ffn_norm", "w_q": "attention.wq", "w_k": "attention.wk", "w_v": "attention.wv",
              "w_o": "attention.wo", "w_gate": "feed_forward.w1", "w_up": "feed_forward.w3",
              "w_down": "feed_forward.w2", "blocks": "layers"}
LINEAR_LAYOUT = "nn.Linear stores its weight as (out_features, in_features), and so does the checkpoint"
TRANSPOSED = (f"the weights are transposed (w.T): {LINEAR_LAYOUT}",
              "copy each weight as it is, with no .T (GPT-2's checkpoints, whose Conv1D layers store (in, out), are "
              "the ones that need it).")
HEAD_NOT_TIED = ("the head is not tied to the embedding when the checkpoint has none: a model with "
                 "tie_word_embeddings saves no head of its own, its head is the embedding",
                 "when the checkpoint has no head, copy the embedding into model.head.weight (or tie the two).")
HEAD_FROM_THE_EMBEDDING = ("the head is taken from the embedding although the checkpoint has one of its own: only a "
                           "tied checkpoint, which has no head, uses the embedding as its head",
                           "copy the checkpoint's head when it has one, and the embedding only when it has none.")
KV_HEADS = ("w_k and w_v have n_kv_heads heads of d_k rows, fewer than w_q's n_heads when the model groups its query "
            "heads; a head count taken from the queries does not fit the keys",
            "take each weight's head count from its own rows, w.size(0) // d_k (d_k = block.d_k): reorder wq and wk "
            "head by head, each with the same d_k.")

LOAD_INTO = ("copy into the parameters the model has, under torch.no_grad(): model.embed.weight.copy_(w), or "
             "model.load_state_dict(...) with your names; either keeps the model's dtype and device.")
LOAD_HINT = "return the model you were given, loaded in place: return model."


def _gpt_key(layout: dict, key: str) -> str:
    """A GPT parameter's name (``blocks.0.w_q.weight``) in a checkpoint's layout (``model.layers.0.self_attn...``)."""
    parts = key.split(".")
    if parts[0] == "blocks":
        return f"{layout['blocks']}.{parts[1]}.{layout[parts[2]]}.weight"
    return f"{layout[parts[0]]}.weight"


def _reference_gpt(case: LoadCase) -> ref.GPT:
    return ref.GPT(case.vocab, case.d_model, case.n_heads, case.n_layers, case.d_ff,
                   n_kv_heads=case.n_kv_heads).double()


def _load_state(case: LoadCase, seed: int) -> dict:
    """Random weights in a GPT's names, float64 on the CPU (the norms' around 1, so a misplaced one shows)."""
    return randomise(_reference_gpt(case), SeededRandom(seed)).state_dict()


def _load_inputs(name: str, layout: dict, i: int, case: LoadCase, hidden: bool, dtype: torch.dtype = torch.float64):
    """Case ``i`` of the loader ``name``: the weights the model holds before loading (float64), the checkpoint
    (random weights under ``layout``'s names, in ``dtype`` or the case's ``stored`` one, without a head when the
    case is tied) and the token ids whose logits judge the load, on the CPU."""
    seed = functools.partial(seed_for, name, hidden, i)
    checkpoint = {_gpt_key(layout, key): value.to(case.stored or dtype)
                  for key, value in _load_state(case, seed("checkpoint")).items()
                  if not (case.tied and key == "head.weight")}
    idx = torch.randint(case.vocab, LOADED_IDX, generator=SeededRandom(seed()).generator)
    return _load_state(case, seed("model")), checkpoint, idx


def _loaded_gpt(loader, before: dict, checkpoint: dict, case: LoadCase) -> ref.GPT:
    """A float64 reference GPT that held ``before`` and was then loaded by ``loader`` (the reference's, or a
    mistake's)."""
    model = _reference_gpt(case)
    model.load_state_dict(before)
    loader(model, checkpoint)
    return model


def _loading(loader):
    """What ``loader`` makes of a checkpoint: the logits, for the token ids ``idx``, of ``_loaded_gpt``."""

    def logits(before: dict, checkpoint: dict, idx: torch.Tensor, case: LoadCase) -> torch.Tensor:
        model = _loaded_gpt(loader, before, checkpoint, case)
        with torch.no_grad():
            return model(idx)[0]

    return logits


def _square_transposed(w: torch.Tensor) -> torch.Tensor:
    """w.T where that keeps w's shape (a (d_model, d_model) projection); elsewhere .copy_(w.T) raises."""
    return w.T if w.dim() == 2 and w.size(0) == w.size(1) else w


def _both_loaders_mistakes(loader, transposed: tuple[str, str], head: str) -> list[Mistake]:
    """The mistakes either loader can make: its weights transposed (``transposed``: the line that copies a block's
    weight, and that line transposing it), and the head left as it was or taken from the embedding (``head``: the
    line that copies the head, which falls back on the embedding)."""
    return [
        Mistake(*TRANSPOSED, _loading(edited(loader, transposed, transposed=_square_transposed))),
        Mistake(HEAD_NOT_TIED[0] + ", and yours kept the weights it had", HEAD_NOT_TIED[1],
                _loading(edited(loader, (head, head.replace(", embedding", ", model.head.weight"))))),
        Mistake(*HEAD_FROM_THE_EMBEDDING, _loading(edited(loader, (head, "model.head.weight.copy_(embedding)")))),
    ]


HF_COPY = 'getattr(block, ours).weight.copy_(state_dict[f"model.layers.{i}.{theirs}.weight"])'
HF_MISTAKES = [
    *_both_loaders_mistakes(ref.load_hf_llama, (HF_COPY, HF_COPY.replace("copy_(", "copy_(transposed(") + ")"),
                            'model.head.weight.copy_(state_dict.get("lm_head.weight", embedding))'),
    Mistake("Hugging Face's q_proj and k_proj were reordered as Meta's are: Hugging Face's converter has already "
            "reordered them to the half-split pairs its rotate_half (and the course's RoPE) rotates, so they copy as "
            "they are",
            "copy every weight of a Hugging Face checkpoint as it is; only Meta's layout needs the reordering.",
            _loading(edited(ref.load_hf_llama, (
                HF_COPY, 'w = state_dict[f"model.layers.{i}.{theirs}.weight"]\n'
                         '            getattr(block, ours).weight.copy_(interleaved_to_half_split(w, block.d_k) '
                         'if ours in ("w_q", "w_k") else w)')))),
    Mistake("the two norms are swapped: input_layernorm normalises the attention's input (attn_norm), and "
            "post_attention_layernorm, which comes after the attention sublayer, the FFN's input (ffn_norm); both "
            "are Pre-Norms",
            "attn_norm <- input_layernorm, ffn_norm <- post_attention_layernorm.",
            _loading(edited(ref.load_hf_llama,
                            ('"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"',
                             '"attn_norm": "post_attention_layernorm", "ffn_norm": "input_layernorm"')))),

]


# The reference's interleaved_to_half_split with (old, new) changes made to its source (``edited``).
_reordered = functools.partial(edited, ref.interleaved_to_half_split)
META_ROTATED = 'if ours in ("w_q", "w_k"):'
PAIRS = ("Meta's code rotates neighbouring features (2i, 2i + 1) of each head, the course's RoPE (i, i + d_k/2): "
         "within each head, row 2i of wq and wk must move to i, and row 2i + 1 to i + d_k/2")
META_MISTAKES = [
    Mistake(f"wq and wk are copied without reordering their rows: {PAIRS}",
            "reorder the rows of wq and wk with interleaved_to_half_split(w, block.d_k) before copying them.",
            _loading(edited(ref.load_meta_llama, (META_ROTATED, "if False:")))),
    Mistake("the rows of wv are reordered too: only what RoPE rotates, the queries and the keys, must be; the values "
            "are never rotated, and their features must stay where wo reads them",
            "reorder wq and wk only; copy wv and wo as they are.",
            _loading(edited(ref.load_meta_llama, (META_ROTATED, 'if ours in ("w_q", "w_k", "w_v"):')))),
    Mistake("the rows of wv and wo are reordered too: only what RoPE rotates, the queries and the keys, must be; wo's "
            "rows are the model's own features, and wv's are what wo reads",
            "reorder wq and wk only; copy wv and wo as they are.",
            _loading(edited(ref.load_meta_llama, (META_ROTATED, 'if ours in ("w_q", "w_k", "w_v", "w_o"):')))),
    Mistake("only wq's rows are reordered: the keys are rotated too, and must be reordered the same way, or the scores "
            "pair a query's features with other features of the key",
            "reorder wk's rows as well (it has n_kv_heads heads of d_k rows).",
            _loading(edited(ref.load_meta_llama, (META_ROTATED, 'if ours in ("w_q",):')))),
    Mistake("the rows are reordered the wrong way round, from half-split to interleaved: row i must receive row 2i "
            "(and row i + d_k/2 row 2i + 1), not row 2i receive row i",
            "in each head, take the even rows first, then the odd ones: w[rows] with rows = [0, 2, 4, ..., 1, 3, 5, "
            "...] (head by head).",
            _loading(edited(ref.load_meta_llama, interleaved_to_half_split=_reordered(
                ("order = torch.cat([torch.arange(0, d_k, 2), torch.arange(1, d_k, 2)])",
                 "order = torch.stack([torch.arange(d_k // 2), torch.arange(d_k // 2, d_k)], dim=1).flatten()"))))),
    Mistake("the rows are reordered across all the heads at once: the even rows of the whole matrix, then the odd "
            "ones; each head's d_k rows must be reordered on their own",
            "reorder within each head: rows head·d_k + [0, 2, ..., d_k - 2, 1, 3, ..., d_k - 1] for every head.",
            _loading(edited(ref.load_meta_llama, ("interleaved_to_half_split(w, block.d_k)",
                                                  "interleaved_to_half_split(w, w.size(0))")))),
    Mistake(f"wk's rows are reordered as if it had as many heads as wq: {KV_HEADS[0]}",
            KV_HEADS[1],
            _loading(edited(ref.load_meta_llama, ("interleaved_to_half_split(w, block.d_k)",
                                                  "interleaved_to_half_split(w, w.size(0) // block.n_heads)")))),
    Mistake("the FFN's w1 and w3 are swapped: in Meta's code w1 is the gate (silu(w1(x)) * w3(x)), w3 the up "
            "projection and w2 the down projection",
            "w_gate <- feed_forward.w1, w_up <- feed_forward.w3, w_down <- feed_forward.w2.",
            _loading(edited(ref.load_meta_llama, ('"w_gate": "feed_forward.w1", "w_up": "feed_forward.w3"',
                                                  '"w_gate": "feed_forward.w3", "w_up": "feed_forward.w1"')))),
    *_both_loaders_mistakes(ref.load_meta_llama, ("weight.copy_(w)", "weight.copy_(transposed(w))"),
                            'model.head.weight.copy_(checkpoint.get("output.weight", embedding))'),
]


def check_load_hf_llama(load_hf_llama, hidden: bool = False) -> None:
    """Check a learner's ``load_hf_llama(model, state_dict)``: a Hugging Face LlamaForCausalLM state dict (random
    weights, tied and untied heads, grouped-query heads) loaded into a stand-in with a GPT's parameters, judged
    by the logits of a reference GPT holding what it loaded."""
    _check_loader("load_hf_llama", load_hf_llama, HF_NAMES, ref.load_hf_llama, HF_MISTAKES, hidden)


def check_load_meta_llama(load_meta_llama, hidden: bool = False) -> None:
    """Check a learner's ``load_meta_llama(model, checkpoint)``: a checkpoint in Meta's layout, whose wq and wk
    pair RoPE's features as neighbours, loaded as ``check_load_hf_llama`` loads Hugging Face's."""
    _check_loader("load_meta_llama", load_meta_llama, META_NAMES, ref.load_meta_llama, META_MISTAKES, hidden)


def _check_loader(name, loader, layout: dict, reference, mistakes: list, hidden: bool) -> None:
    """The learner's ``loader`` is given a ``stand_in_models.LoadTarget`` (a GPT's parameters, random, and each block's
    head counts; not the learner's GPT, so a mistake there costs only its own exercise) and a checkpoint, both
    made where the learner's code runs. The weights it then holds are read back and judged here, by the logits
    of a reference GPT holding them, against those of the reference loader."""
    cases = HIDDEN_LOAD if hidden else VISIBLE_LOAD

    def check_case(i: int, case: LoadCase, device, dtype) -> None:
        before, checkpoint, idx = _load_inputs(name, layout, i, case, hidden, dtype)
        before = {k: v.to(dtype) for k, v in before.items()}  # what the model holds first
        target = make_in_kernel(loader, stand_in_models.load_target, {k: v.to(device) for k, v in before.items()},
                                case.n_heads)
        run = _call_loader(name, loader, target, {k: v.clone() for k, v in checkpoint.items()}, case, layout)
        if not isinstance(run, dict) or run.get("changed") is not False:  # the kernel's word: a note when graded
            kernel_reported(name, loader, "changed the checkpoint it was given (its tensors, or its keys): the "
                            "checkpoint is the caller's, and loading it twice must give the same model",
                            "make new tensors (w[rows], .clone()) instead of changing the checkpoint's in place, "
                            "and leave its keys as they are.")
        if not isinstance(run, dict) or run.get("model") is not True:
            kernel_reported(name, loader, "returns "
                            f"{str(run.get('returned') if isinstance(run, dict) else None)[:40]}, "
                            "not the model it was given", LOAD_HINT)
        state = _loaded_state(name, run_in_kernel(in_kernel.state_of, target), before, device)
        before64 = {k: v.double() for k, v in before.items()}
        logits = _loading(lambda model, _: model.load_state_dict(state))(before64, checkpoint, idx, case)
        expected = _loading(reference)(before64, checkpoint, idx, case)
        if not close(logits, expected, precision=dtype):
            mistaken = list(candidates(mistakes, before64, checkpoint, idx, case))
            loaded = _loaded_gpt(reference, before64, checkpoint, case).state_dict()
            differing = [key for key, value in loaded.items() if not close(state[key], value)]
            if matching_mistake(logits, mistaken) is None:
                _name_a_parameter(name, state, loaded, before64, differing)
            where = f" (the first parameter that differs from the reference's: {differing[0]})" if differing else ""
            name_the_mistake(name, f"the logits of a GPT holding the weights your function loaded{where}", logits,
                             expected, mistaken)

    with strict_numerics(), one_thread():
        run_cases(name, cases, check_case)


def _call_loader(name, loader, target, checkpoint: dict, case: LoadCase, layout: dict) -> dict:
    """``loader(target, checkpoint)``, run where the learner's code runs (``in_kernel.loaded``); an error that a
    known mistake explains is named."""
    try:
        return learner_step(name, lambda: run_in_kernel(in_kernel.loaded, loader, target, checkpoint),
                            (target, checkpoint))
    except CheckFailed as error:
        if error.raised is None:
            raise
        message = error.exception or ""  # what the learner's code raised: PyTorch's words, or Python's KeyError
        if case.tied and error.raised == "KeyError" and f"{layout['head']}.weight" in message:
            problem, hint = HEAD_NOT_TIED
        elif "must match the size of tensor" in message or "size mismatch for" in message:
            problem = f"A shape does not fit. If your code transposes weights (w.T), it should not: {LINEAR_LAYOUT}."
            hint = TRANSPOSED[1]
        elif case.n_kv_heads < case.n_heads and any(word in message for word in ("size", "shape")):
            problem = (f"This case groups its query heads (n_heads={case.n_heads}, n_kv_heads={case.n_kv_heads}): "
                       f"{KV_HEADS[0]}")
            hint = KV_HEADS[1]
        else:
            raise
        restate(error, problem, hint)


def _name_a_parameter(name, state: dict, expected: dict, before: dict, differing: list[str]) -> None:
    """Fail naming a parameter whose weights show what went wrong: left as it was, or transposed."""
    for key in differing:
        if close(state[key], before[key]) and not close(expected[key], before[key]):
            fail(name, f"{key} was not loaded: it still holds the weights the model had before", LOAD_INTO)
        if state[key].dim() == 2 and state[key].shape == expected[key].mT.shape and close(state[key], expected[key].mT):
            fail(name, f"{key} holds the transpose of the weight it should: {TRANSPOSED[0]}", TRANSPOSED[1])


def _loaded_state(name, state, before: dict, device) -> dict:
    """The weights the model holds after loading: every parameter it had, with its shape, dtype and device."""
    if not isinstance(state, dict):
        fail(name, "the model's weights could not be read back", LOAD_INTO)
    for key, old in before.items():
        got = state.get(key)
        if not isinstance(got, torch.Tensor):
            fail(name, f"the model no longer has the parameter {key}: load the weights into the modules it has, "
                 "without replacing or removing them", LOAD_INTO)
        if tuple(got.shape) != tuple(old.shape):
            problem, hint = (TRANSPOSED if tuple(got.shape) == tuple(old.shape)[::-1] else
                             ("the model's parameters must keep their shapes", LOAD_INTO))
            fail(name, f"parameter {key} now has shape {tuple(got.shape)}, expected {tuple(old.shape)}: {problem}",
                 hint)
        if got.dtype != old.dtype or got.device.type != torch.device(device).type:
            fail(name, f"parameter {key} is now {got.dtype} on {got.device.type}, where the model was {old.dtype} on "
                 f"{torch.device(device).type}: the parameters were replaced by the checkpoint's tensors (or the "
                 "model converted) instead of being loaded", LOAD_INTO)
    return {key: state[key].detach().to("cpu", torch.float64) for key in before}
