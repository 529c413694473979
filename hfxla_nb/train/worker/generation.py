"""`generate`: generation on XLA with fixed shapes, inside a launched worker; and the same
decoding on the CPU for `FineTuneResult.generate`.

`model.generate()` on XLA recompiles for every new token when the cache grows with the text
(transformers #18661). Here every shape is fixed before the first token (`decode`, also used
by causal-LM `predict`): prompts padded on the left to a multiple of `bucket`, a `StaticCache`
of prompt + new tokens, the attention mask over that whole length from the start, the
position of each new token and the step's index as device tensors, the tokens written into a
`[rows, max_new_tokens]` buffer with a mask. A generation compiles two graphs per prompt
bucket, however many tokens: the prompt's (with the first token) and one decoding step's.

Early stop, without a sync per token: every `check_every` steps (default 16) one small
transfer fetches which rows have ended; with `stop_strings` (or streaming) the tokens so far
come in the same transfer and the host looks for the stop strings (or sends the new text).
When every row has ended the loop stops. The fetched values are already computed, so a check
adds no graph.

The next token is chosen on the device: transformers' logits processors (repetition penalty,
then, when sampling, temperature, top-k, top-p and min-p, in transformers' order and with the
same arithmetic) as tensor ops with fixed shapes. A draw uses the Gumbel-max trick, with noise
from a counter-based hash of (seed, row key, step, token) computed in int32 on the device: no
RNG state to carry between graphs, the step is graph data (no recompile), and the same seed
gives the same tokens on the same hardware, whatever the batch size or the number of devices.
"""

from __future__ import annotations

import inspect
import os
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ... import _xla, patches
from ...events import Generated, Progress, emit, worker_channel, worker_rank
from ...launch.output import quiet_loading
from ...observe.reporting import BAR_INTERVAL
from .. import preparation
from ..config import (
    GenerationOptions,
    check_room,
    cut_at_stop,
    finished_text,
    model_generation_config,
    prompt_rows,
    resolve_options,
)
from ..experts import use_dense_experts

if TYPE_CHECKING:
    import torch


# -- the next token, chosen on the device --

# lowbias32's constants (Chris Wellons' hash prospector), written as signed int32.
_MULTIPLY_1 = 0x7FEB352D
_MULTIPLY_2 = 0x846CA68B - 2**32
_GOLDEN = 0x9E3779B9 - 2**32


def uses_seen(options: GenerationOptions) -> bool:
    """Whether the decoding keeps a mask of the tokens seen so far (repetition penalty)."""
    return options.repetition_penalty is not None and options.repetition_penalty != 1.0


def seen_tokens(ids: torch.Tensor, mask: torch.Tensor, vocab: int) -> torch.Tensor:
    """`[rows, vocab]` bool: the prompt's tokens (padding, `mask` 0, left out)."""
    import torch

    seen = torch.zeros(ids.shape[0], vocab, dtype=torch.bool, device=ids.device)
    return seen.scatter(1, ids.long(), mask.bool())


def add_seen(seen: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """`seen` with each row's new token (`[rows, 1]`) marked (a comparison, no scatter)."""
    import torch

    return seen | (torch.arange(seen.shape[1], device=seen.device)[None, :] == token)


def processed_logits(logits: torch.Tensor, options: GenerationOptions,
                     seen: torch.Tensor | None = None) -> torch.Tensor:
    """`[rows, vocab]` float32 logits after transformers' processors for these options
    (removed tokens at -inf), as `generate` would apply them."""
    import torch

    scores = logits.float()
    if seen is not None and uses_seen(options):
        penalty = float(options.repetition_penalty)
        penalised = torch.where(scores < 0, scores * penalty, scores / penalty)
        scores = torch.where(seen, penalised, scores)
    if not options.do_sample:
        return scores
    if options.temperature is not None and options.temperature != 1.0:
        scores = scores / float(options.temperature)
    if options.top_k is not None and options.top_k != 0:
        k = min(max(int(options.top_k), 1), scores.shape[-1])
        kth = torch.topk(scores, k)[0][..., -1, None]
        scores = scores.masked_fill(scores < kth, -float("inf"))
    if options.top_p is not None and options.top_p < 1.0:
        scores = _top_p(scores, float(options.top_p))
    if options.min_p is not None:
        probs = scores.softmax(-1)
        # The most likely token always stays (its probability is the maximum).
        floor = float(options.min_p) * probs.amax(-1, keepdim=True)
        scores = scores.masked_fill(probs < floor, -float("inf"))
    return scores


def _top_p(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """TopPLogitsWarper: drop the least likely tokens whose total probability is at most
    1 - top_p, keeping at least the most likely one."""
    import torch

    ordered, order = torch.sort(scores, descending=False)
    cumulative = ordered.softmax(-1).cumsum(-1)
    drop = cumulative <= (1 - top_p)
    last = torch.arange(drop.shape[-1], device=drop.device)[None, :] == drop.shape[-1] - 1
    drop = drop & ~last
    removed = drop.scatter(1, order, drop)
    return scores.masked_fill(removed, -float("inf"))


def next_tokens(logits: torch.Tensor, options: GenerationOptions, seen: torch.Tensor | None,
                seed: torch.Tensor, keys: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """`[rows, 1]` int64: each row's next token, greedy or drawn.

    Args:
        logits: `[rows, vocab]` of the last position.
        options: the decoding's options.
        seen: the tokens seen so far (repetition penalty), or None.
        seed: `[1]` int32 on the device (data: another seed compiles nothing).
        keys: `[rows]` int32 row keys (the prompt's index: draws do not depend on the batch).
        step: `[1]` int32, the new token's index.
    """
    scores = processed_logits(logits, options, seen)
    if options.do_sample:
        scores = scores + gumbel_noise(seed, keys, step, scores.shape[-1])
    return scores.argmax(-1, keepdim=True)


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int32 `x`, shifting only non-negative values: torch_xla's `>>`
    of a negative int32 rounds toward zero (a division), torch's CPU one toward -inf."""
    return ((x & 0x7FFFFFFF) >> bits) + (x < 0).int() * (1 << (31 - bits))


def _hash(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 on int32 tensors (products wrap around, as on any two's-complement device)."""
    x = x ^ _shift_right(x, 16)
    x = x * _MULTIPLY_1
    x = x ^ _shift_right(x, 15)
    x = x * _MULTIPLY_2
    return x ^ _shift_right(x, 16)


def uniform_noise(seed: torch.Tensor, keys: torch.Tensor, step: torch.Tensor,
                  vocab: int) -> torch.Tensor:
    """`[rows, vocab]` float32 in (0, 1): a hash of (seed, row key, step, token)."""
    import torch

    row = _hash(_hash(_hash(seed.int()) ^ keys.int()) ^ (step.int() * _GOLDEN))
    tokens = torch.arange(vocab, dtype=torch.int32, device=keys.device)
    bits = _hash(row[:, None] ^ (tokens[None, :] * _GOLDEN + 0x632BE5AB))
    return (_shift_right(bits, 8).float() + 0.5) / float(1 << 24)


def gumbel_noise(seed: torch.Tensor, keys: torch.Tensor, step: torch.Tensor,
                 vocab: int) -> torch.Tensor:
    """`[rows, vocab]` Gumbel(0, 1) noise: argmax(logits + noise) draws from softmax(logits)."""
    return -(-uniform_noise(seed, keys, step, vocab).log()).log()


# -- decoding at fixed shapes, with early stop --

@dataclass
class DecodeHooks:
    """What the engine does between steps, by where it runs.

    Attributes:
        sync: called with the state's tensors after the prompt and after every step (on XLA:
            replicate them over the mesh, then `torch_xla.sync()`; on the CPU: nothing).
        fetch: copies device tensors to the host in one transfer (on the CPU: as they are).
        autocast: the context the forward passes run in (mixed precision), or None.
        tokenizer: decodes the tokens at a check when there are stop strings.
        on_check: called at each check with every row's tokens so far (host lists) and the
            steps run: the tokens come in the check's one transfer (streaming).
        capture: on XLA, trace the decoding step once and run its compiled graph for every
            later token (`StepGraph`); the CPU runs the model itself.
        mark: on XLA over a mesh, marks the step's traced state as `sync` would (replicated),
            without running it: the compiled step returns it as it reads it.
        on_step: called after the prompt and after every step, once its work is handed to
            the device (a benchmark times the steps by it).
    """

    sync: Callable[[list], None]
    fetch: Callable[[list], list]
    autocast: Callable[[], Any] | None = None
    tokenizer: Any = None
    on_check: Callable[[list[list[int]], int], None] | None = None
    capture: bool = False  # on XLA: run the decoding step by its compiled graph (`StepGraph`)
    on_step: Callable[[], None] | None = None
    mark: Callable[[list], None] | None = None


@dataclass
class Decoded:
    """What a decoding returns.

    Attributes:
        tokens: `[rows, max_new_tokens]` on the device: the new tokens (after a row ended,
            or after the last step run, whatever the buffer held).
        steps: the decoding steps run (tokens chosen per row), `max_new_tokens` at most.
        checks: the early-stop checks made (one small transfer each).
        done: `[rows]` bool on the device: which rows produced an end-of-text token.
    """

    tokens: torch.Tensor
    steps: int
    checks: int
    done: torch.Tensor


def cache_argument(model: Any) -> str:
    """The forward's name for the key/value cache (transformers 5: `cache`, before:
    `past_key_values`)."""
    return ("cache" if "cache" in inspect.signature(model.forward).parameters
            else "past_key_values")


def decode(model: Any, ids: torch.Tensor, mask: torch.Tensor, options: GenerationOptions,
           hooks: DecodeHooks, keys: torch.Tensor | None = None,
           live: torch.Tensor | None = None) -> Decoded:
    """Decode up to `options.max_new_tokens` tokens for a batch of left-padded prompts.

    Args:
        model: a causal LM in eval mode, on the device of `ids`.
        ids, mask: `[rows, length]` prompt ids and their attention mask (0 on padding).
        options: the decoding's options.
        hooks: sync, fetch and autocast for where it runs.
        keys: `[rows]` row keys for the draws (default: the row's index).
        live: `[rows]`, 0 for filler rows (never waited for); default every row.

    Returns:
        `Decoded`: the token buffer, the steps run and the checks made.
    """
    import torch
    from transformers import StaticCache

    rows, length = ids.shape
    new, device = options.max_new_tokens, ids.device
    ids, mask = ids.long(), mask.long()
    full = torch.cat([mask, torch.ones(rows, new, dtype=mask.dtype, device=device)], dim=1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = StaticCache(config=model.config, max_cache_len=length + new)
    name, autocast = cache_argument(model), hooks.autocast or nullcontext
    state = {
        "tokens": torch.zeros(rows, new, dtype=torch.long, device=device),
        "done": (torch.zeros(rows, dtype=torch.bool, device=device) if live is None
                 else live.reshape(rows) == 0),
        "seen": (seen_tokens(ids, mask, model.config.vocab_size)
                 if uses_seen(options) else None),
        "position": positions[:, -1:],
    }
    seed = torch.tensor([options.seed & 0x7FFFFFFF], dtype=torch.int32, device=device)
    keys = (torch.arange(rows, dtype=torch.int32, device=device) if keys is None
            else keys.reshape(rows).int())
    # Padded to 8 ids with -1 (no token): one, two or three end tokens share the graphs.
    ends = list(options.eos_token_ids)
    eos = torch.tensor(ends + [-1] * max(8 - len(ends), 0), dtype=torch.long, device=device)
    columns = torch.arange(new, device=device)[None, :]
    # A mixture of experts that reports its router logits (Mixtral's config with the aux loss
    # on) would compute that loss against the whole mask at each token: off, as generate does.
    routers = ({"output_router_logits": False}
               if getattr(getattr(model, "config", None), "output_router_logits", False) else {})
    with autocast():
        output = model(input_ids=ids, attention_mask=full[:, :length], position_ids=positions,
                       cache_position=torch.arange(length, device=device), use_cache=True,
                       **{name: cache}, **routers)
    step_tensor = torch.zeros(1, dtype=torch.int32, device=device)
    # The next step's cache position and index: data, not constants (every step is the same
    # graph), carried from step to step on the device rather than uploaded for each token.
    state = _chosen(state, output.logits[:, -1], options, (seed, keys, step_tensor), columns,
                    eos) | {"where": torch.tensor([length], device=device),
                            "step": torch.tensor([1], dtype=torch.int32, device=device)}
    hooks.sync([tensor for tensor in state.values() if tensor is not None] + [full])
    stepped = hooks.on_step or (lambda: None)
    stepped()
    steps, checks, ended = 1, 0, [False] * rows
    graph: StepGraph | None = None
    capture = hooks.capture
    proof = StepProof()
    while steps < new:
        if steps % options.check_every == 0:
            checks += 1
            if _all_ended(state, steps, options, hooks, ended):
                break
        if graph is not None:
            state = graph.run(state)
            stepped()
            steps += 1
            continue
        before, carried = dict(state), cache_tensors(cache)
        # The cache's tensors before the step: an update in place gives a tensor a new id.
        carried_ids = [_xla.tensor_id(tensor) for tensor in carried] if capture else []
        fallbacks = _xla.fallback_counts() if capture else {}
        where, step_tensor = state["where"], state["step"]
        state["position"] = state["position"] + 1
        with autocast():
            output = model(input_ids=state["token"], attention_mask=full,
                           position_ids=state["position"], cache_position=where,
                           use_cache=True, **{name: cache}, **routers)
        state = _chosen(state, output.logits[:, -1], options, (seed, keys, step_tensor),
                        columns, eos) | {"where": where + 1, "step": step_tensor + 1}
        del output  # traced logits nothing reads: never run
        replays = True  # whether the graph captured here runs the later steps too
        if capture:
            capture = False
            if hooks.mark is not None:
                hooks.mark([tensor for tensor in state.values() if tensor is not None])
            graph = StepGraph.capture(model, before, state, carried, carried_ids, fallbacks)
            if graph is not None:
                graph, decided = proof.check(graph)
                replays, capture = bool(decided), decided is None
        if graph is not None:
            # The traced step is dropped unrun (its tensors die here, its compiled graph
            # runs instead), and the cache's own tensors with it: the graph carries the cache.
            del carried
            places = drop_cache_tensors(cache)
            state = graph.run(before)
            if not graph.kept_shardings or not replays:
                # Outputs sharded otherwise than the inputs they become: the program would
                # read them wrongly; or constants made on the host not yet proven the same.
                # Later steps are traced (their sync compiles for them).
                put_cache_tensors(places, graph.cache)
                graph = None
        else:
            hooks.sync([tensor for tensor in state.values() if tensor is not None] + [full])
        stepped()
        steps += 1
    return Decoded(state["tokens"], steps, checks, state["done"])


def drop_cache_tensors(cache: Any) -> list[tuple[Any, str]]:
    """Let go of every tensor a static cache holds (`cache_tensors`): a `StepGraph` carries
    them from then on. Returns where each was (`(layer, attribute)`, in their order)."""
    import torch

    places = []
    for layer in getattr(cache, "layers", ()):
        for attribute, value in list(vars(layer).items()):
            if isinstance(value, torch.Tensor):
                setattr(layer, attribute, None)
                places.append((layer, attribute))
    return places


def put_cache_tensors(places: list[tuple[Any, str]], tensors: list[torch.Tensor]) -> None:
    """Give a static cache back its tensors (`drop_cache_tensors`' places, in order)."""
    for (layer, attribute), tensor in zip(places, tensors, strict=True):
        setattr(layer, attribute, tensor)


def cache_tensors(cache: Any) -> list[torch.Tensor]:
    """Every tensor a static cache holds (each layer's keys, values and lengths): what a
    decoding step updates in place."""
    import torch

    found = []
    for layer in getattr(cache, "layers", ()):
        found += [value for value in vars(layer).values() if isinstance(value, torch.Tensor)]
    return found


class StepProof:
    """Whether a captured decoding step may run the later steps: yes when its trace made no
    constant on the host; else only once a second trace gave the same graph with the same
    values in those places (a Python number each step: yes; a host draw per token: no)."""

    def __init__(self) -> None:
        self.first: StepGraph | None = None  # the first capture, while it waits for proof

    def check(self, graph: StepGraph) -> tuple[StepGraph, bool | None]:
        """The graph to run this step by, and whether it runs the later steps: True, False
        (they are traced), or None (the next step is traced and captured again)."""
        if self.first is None:
            if not graph.graph.traced_constants:
                return graph, True
            self.first = graph
            return graph, None
        # The first graph runs on: its inputs are named as the state's and the cache's, while
        # the second trace's may take a state tensor made by the first run for a constant
        # (so its constants may lie in more places).
        if self.first.graph.constants_unlike(graph.graph, same_places=False) != []:
            return graph, False
        self.first.cache = graph.cache
        return self.first, True


class StepGraph:
    """A decoding step traced once and run by its compiled graph for every token.

    Tracing transformers' forward and the logits processors costs the host more per token
    than a small model's step takes to run. The step's graph is the same at every token (its
    inputs are data), so it is traced once, at the first step, and compiled
    (`_xla.CompiledGraph`). Every token, the first too, passes the previous step's outputs
    (the state, and the cache the step updates) as the next inputs to that program: no
    trace, the same program, the same tokens. Where the first run's outputs come back
    sharded otherwise than they went in (`kept_shardings`), the caller traces the later
    steps instead.

    Args:
        graph: the compiled step; its roles are ("state", name) and ("cache", index).
        names: the state's names, in the order of the outputs; the cache's tensors follow.
        cache: the cache's tensors, as the next step reads them.
    """

    def __init__(self, graph: _xla.CompiledGraph, names: list[str],
                 cache: list[torch.Tensor]) -> None:
        self.graph, self.names, self.cache = graph, names, cache
        #: Whether the first run's outputs came back sharded as the inputs they become went
        #: in (always, off a mesh); None before it.
        self.kept_shardings: bool | None = None

    @classmethod
    def capture(cls, model: Any, before: dict, after: dict, carried: list,
                carried_ids: list[int], fallbacks: dict[str, int]) -> StepGraph | None:
        """The first step's graph, traced (`after` and the cache's tensors pending) and
        compiled; None where it cannot be run on the next inputs (the caller then syncs the
        traced step and traces every step, as on the CPU): an op ran on the CPU while it was
        traced (what it read may differ at the next token), or a random op of the model.

        Args:
            model: the network (its parameters and buffers are the graph's weights).
            before: the state the step read; after: the state it traced.
            carried: the cache's tensors (updated in place by the step).
            carried_ids: their ids before the step (the graph's inputs are named by them).
            fallbacks: `_xla.fallback_counts()` before the step was traced.
        """
        if _xla.fallbacks_since(fallbacks):
            return None
        names = [name for name, value in after.items() if value is not None]
        weights = [*model.parameters(), *model.buffers()]
        roles = {_xla.tensor_id(tensor): ("state", name) for name, tensor in before.items()
                 if tensor is not None}
        roles.update({tensor_id: ("cache", i) for i, tensor_id in enumerate(carried_ids)})
        captured = _xla.CompiledGraph.capture([after[name] for name in names] + list(carried),
                                              roles, weights)
        # A random op of the model (one that samples inside its forward): traced, as an
        # evaluation batch with one is; decoding draws its own noise from `seed` and `keys`.
        if isinstance(captured, _xla.Declined) or captured[0].reads_seed:
            return None
        graph, inputs = captured
        cache = list(carried)
        for slot, tensor in zip(graph.slots, inputs, strict=True):
            if slot[0] == "cache":
                cache[slot[1]] = tensor  # the cache before the step, on its own data
        return cls(graph, names, cache)

    def run(self, state: dict) -> dict:
        """The state after one more step: the compiled graph run on `state` and the cache."""
        # What the outputs become, read at the first run only (a token's run reads nothing).
        carried = ([*(state.get(name) for name in self.names), *self.cache]
                   if self.kept_shardings is None else [])
        outputs = self.graph.run(self.graph.inputs({"state": state, "cache": self.cache}))
        if self.kept_shardings is None:
            # Over a mesh XLA picks the shardings of the outputs no mark fixed (the cache).
            self.kept_shardings = all(
                before is None or _xla.sharding_spec(before) == _xla.sharding_spec(after)
                for before, after in zip(carried, outputs, strict=True))
        self.cache = outputs[len(self.names):]
        # The token ends as a traced token's sync would: the device's seed moves on, so a
        # training that decodes in its evaluation draws the traced loop's dropout after it.
        _xla.end_step()
        return {**state, **dict(zip(self.names, outputs[:len(self.names)], strict=False))}


def _chosen(state: dict, logits: torch.Tensor, options: GenerationOptions, draw: tuple,
            columns: torch.Tensor, eos: torch.Tensor) -> dict:
    """The state after choosing each row's token at step `draw[2]` and writing it down."""
    import torch

    seed, keys, step = draw
    token = next_tokens(logits, options, state["seen"], seed, keys, step)
    tokens = torch.where(columns == step.long(), token, state["tokens"])
    done = state["done"] | (token == eos[None, :]).any(-1)
    seen = add_seen(state["seen"], token) if state["seen"] is not None else None
    return {"tokens": tokens, "done": done, "seen": seen, "position": state["position"],
            "token": token}


def _all_ended(state: dict, steps: int, options: GenerationOptions, hooks: DecodeHooks,
               ended: list[bool]) -> bool:
    """Whether every row has ended: an end-of-text token (on the device), or a stop string
    in its text so far (on the host; `ended` remembers those rows). One transfer."""
    with_tokens = bool(options.stop_strings) or hooks.on_check is not None
    fetched = hooks.fetch([state["done"], state["tokens"]] if with_tokens else [state["done"]])
    done = fetched[0].tolist()
    rows = fetched[1][:, :steps].tolist() if with_tokens else []
    if hooks.on_check is not None:
        hooks.on_check(rows, steps)
    if options.stop_strings:
        for i, row in enumerate(rows):
            if not (done[i] or ended[i]):
                text = hooks.tokenizer.decode(row, skip_special_tokens=True)
                ended[i] = cut_at_stop(text, options.stop_strings)[1]
    return all(d or e for d, e in zip(done, ended, strict=True))


# -- generate, in a worker and on the CPU --

def generate(model: str | os.PathLike, prompts: str | list[str] | None = None,
             max_new_tokens: int | None = None, *, messages: Any = None,
             generation_config: Any = None, bucket: int = 16, tokenizer: Any = None,
             stream: bool = True, **options: Any) -> list[str] | list[list[str]]:
    """Continue each prompt on this worker's XLA device, with fixed shapes.

    Call it inside a function launched by `hx.notebook_launcher` (in the kernel, use
    `FineTuneResult.generate`, which runs on the CPU without starting the XLA runtime).

    Args:
        model: a causal-LM folder (`fine_tune` output, `save_pretrained`) or a Hub name.
        prompts: one prompt or a list of prompts, generated together as one batch.
        max_new_tokens: at most this many tokens per prompt (default: the generation
            config's, else 32); the loop stops early once every row has ended.
        messages: instead of prompts, chat turns (`[{"role": ..., "content": ...}]`, or a
            list of such lists) rendered by the tokenizer's chat template.
        generation_config: a `transformers.GenerationConfig` (default: the model's own).
        bucket: prompt lengths are padded to a multiple of this, so prompts of similar length
            share compiled graphs.
        tokenizer: default: the one saved with the model.
        stream: send each row's new text to the notebook every `check_every` tokens and at
            the end (`Generated` events: the cell prints them; `hx.last_launch().streamed`);
            False: only the returned texts.
        options: `do_sample`, `temperature`, `top_k`, `top_p`, `min_p`, `repetition_penalty`,
            `num_return_sequences`, `seed`, `eos_token_id`, `stop_strings`, `check_every`
            (as transformers' `GenerationConfig`; `docs/tasks.md`).

    Returns:
        The new text of each prompt, without the prompt (a list of texts per prompt when
        `num_return_sequences` > 1).

    Raises:
        RuntimeError: called in the kernel rather than in a launched function.
        GenerationError: an option or a prompt that cannot work.
    """
    if worker_channel() is None:
        raise RuntimeError(
            "hx.generate runs on the XLA device inside a launched function: "
            "hx.notebook_launcher(lambda: hx.generate(folder, prompts)). In the kernel itself "
            "use result.generate(prompts) (on the CPU; the XLA runtime stays off).")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = tokenizer or AutoTokenizer.from_pretrained(os.fspath(model))
    config = generation_config or model_generation_config(model)
    settings = resolve_options(tokenizer, config, max_new_tokens, **options)
    rows = prompt_rows(tokenizer, prompts, messages)
    with quiet_loading():  # no "Loading weights 21/21" bar in the launch panel
        network = AutoModelForCausalLM.from_pretrained(os.fspath(model))
    use_dense_experts(network)  # a mixture of experts: static shapes (train/experts.py)
    network.to(_xla.device())
    return decode_prompts(network, tokenizer, rows, settings, bucket, stream,
                          shown_prompts(prompts))


def shown_prompts(prompts: str | list[str] | None) -> list[str] | None:
    """The prompts as the user wrote them, for the streamed text to show (their case and
    spacing kept: an uncased tokenizer's decoding would lower them); None for chat messages
    (their rendering by the template is shown)."""
    if prompts is None:
        return None
    return [prompts] if isinstance(prompts, str) else [str(prompt) for prompt in prompts]


def decode_prompts(network: Any, tokenizer: Any, rows: list[list[int]],
                   settings: GenerationOptions, bucket: int, stream: bool,
                   shown: list[str] | None = None) -> list[str] | list[list[str]]:
    """`generate`'s decoding of prompt token rows with a model already on this worker's XLA
    device (loaded by `generate`, or held warm between cells: `worker.warm`); `shown`: the
    prompts as the stream shows them (default: the rows decoded)."""
    import torch

    network.eval()
    if shown is None:
        shown = [tokenizer.decode(row, skip_special_tokens=True) for row in rows]
    streamer = Streamer(tokenizer, settings, emit, shown) if stream else None
    bar = TokenBar(settings.max_new_tokens)
    hooks = DecodeHooks(sync=lambda tensors: _xla.sync(), fetch=_xla.to_cpu,
                        tokenizer=tokenizer, on_check=streamer.send if streamer else None,
                        capture=True, on_step=bar.step)
    # The mask check's patch (`patches.py`): without it, masking syncs once more, a graph.
    with torch.no_grad(), patches.applied():
        decoded = generate_rows(network, tokenizer, rows, settings, bucket, hooks)
    bar.end(decoded.steps)
    tokens = _xla.to_cpu([decoded.tokens])[0]
    if streamer is not None:
        streamer.send(tokens[:, :decoded.steps].tolist(), decoded.steps, done=True)
    return texts_of(tokenizer, tokens, settings, len(rows))


class TokenBar:
    """A decoding's progress bar, "tokens": from the start, so the panel says "compiling the
    first step" while the prompt's and the step's graphs compile (a streamed generation
    looked dead until its first text); then the tokens handed to the device, twice a second;
    at the end the tokens decoded, done early where every row ended before
    `max_new_tokens`. Sent without a transfer: the steps are counted on the host."""

    LABEL = "tokens"
    ENDED = "every row ended (an end-of-text token or a stop string)"

    def __init__(self, total: int) -> None:
        self.total, self.steps, self.sent = total, 0, time.monotonic()
        emit(Progress(worker_rank(), 0, total, {}, None, self.LABEL))

    def step(self) -> None:
        """A token's work was handed to the device."""
        self.steps += 1
        now = time.monotonic()
        if now - self.sent >= BAR_INTERVAL:
            self.sent = now
            emit(Progress(worker_rank(), self.steps, self.total, {}, None, self.LABEL))

    def end(self, steps: int) -> None:
        """The decoding ran `steps` tokens."""
        emit(Progress(worker_rank(), steps, self.total, {}, None, self.LABEL,
                      ended=self.ENDED if steps < self.total else None))


class Streamer:
    """Hands each row's new text (what was not sent before) to `deliver` as a `Generated`
    event: `emit` in a worker, `print_generated` in the kernel."""

    def __init__(self, tokenizer: Any, options: GenerationOptions,
                 deliver: Callable[[Generated], Any], prompts: Sequence[str] = ()) -> None:
        self.tokenizer, self.options, self.deliver = tokenizer, options, deliver
        self.sent: list[str] = []
        # The prompts, sent once: the panel shows each under the bars.
        self.prompts = list(prompts)

    def send(self, rows: list[list[int]], steps: int, done: bool = False) -> None:
        """Send the text of `rows` (every row's tokens so far) beyond what was sent."""
        texts = [finished_text(self.tokenizer, row, self.options) for row in rows]
        sent = self.sent or [""] * len(texts)
        # A text that no longer starts with what was sent (a word re-split) is sent whole.
        pieces = tuple(text[len(old):] if text.startswith(old) else text
                       for text, old in zip(texts, sent, strict=True))
        first = not self.sent
        self.sent = texts
        prompts = ()
        if first and self.prompts:  # num_return_sequences rows per prompt, in prompt order
            prompts = tuple(self.prompts[i * len(self.prompts) // len(texts)]
                            for i in range(len(texts)))
        self.deliver(Generated(worker_rank(), steps, self.options.max_new_tokens, pieces,
                               done, prompts))


def print_generated(event: Generated) -> None:
    """Print a generation's new text in this process, as a launch's cell shows it."""
    sys.stdout.write(event.shown())
    sys.stdout.flush()


def generate_rows(network: Any, tokenizer: Any, rows: list[list[int]],
                  options: GenerationOptions, bucket: int, hooks: DecodeHooks) -> Decoded:
    """Decode prompt token rows on the network's device: left-padded to a multiple of
    `bucket`, each repeated `num_return_sequences` times (its copies draw differently).

    Raises:
        GenerationError: the padded prompts and the new tokens exceed the model's positions.
    """
    ids, mask, length = left_padded(tokenizer, rows, bucket, options.num_return_sequences)
    check_room(rows, length, options, preparation.position_limit(network.config))
    device = next(network.parameters()).device
    return decode(network, ids.to(device), mask.to(device), options, hooks)


def left_padded(tokenizer: Any, rows: list[list[int]], bucket: int, copies: int = 1):
    """Prompt ids `[rows * copies, length]` padded on the left to a multiple of `bucket`, their
    mask (0 on padding), and the length."""
    import torch

    rows = [row for row in rows for _ in range(copies)]
    length = -(-max(map(len, rows)) // bucket) * bucket
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = torch.full((len(rows), length), int(pad or 0), dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, length - len(row):] = torch.tensor(row)
        mask[i, length - len(row):] = 1
    return ids, mask, length


def texts_of(tokenizer: Any, tokens: Any, options: GenerationOptions,
             prompts: int) -> list[str] | list[list[str]]:
    """Each row's text, cut at its end (`finished_text`); grouped per prompt when
    `num_return_sequences` > 1."""
    texts = [finished_text(tokenizer, row, options) for row in tokens.tolist()]
    copies = options.num_return_sequences
    if copies == 1:
        return texts
    return [texts[i * copies:(i + 1) * copies] for i in range(prompts)]


def cpu_hooks(tokenizer: Any, streamer: Streamer | None = None) -> DecodeHooks:
    """The engine's hooks on the CPU: nothing to sync, tensors already on the host; the new
    text to `streamer` at each check, when given."""
    return DecodeHooks(sync=lambda tensors: None, fetch=list, tokenizer=tokenizer,
                       on_check=streamer.send if streamer is not None else None)
