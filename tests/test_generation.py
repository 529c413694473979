"""Generation people use: transformers' logits processors as fixed-shape tensor ops (the same
scores on the same logits, draws that follow their distribution), the options refused in the
kernel before any fork, chat prompts, and one launch where `hx.generate` decodes greedily as
the CPU path does, draws repeatably, stops early and at stop strings, with the graphs counted
exactly (2 per prompt bucket).

The pytest process never starts the XLA runtime: `hx.generate` runs in one launched worker.
"""

from __future__ import annotations

import pytest

import hfxla_nb as hx
from hfxla_nb import _xla
from hfxla_nb.demo.lm import TEMPLATE
from hfxla_nb.train import FineTuneError
from hfxla_nb.train.config import GenerationError, GenerationOptions, prompt_rows, resolve_options
from hfxla_nb.train.worker import generation
from tests.helpers import refuse_launches

VOCAB = 40
NOISE_INPUTS = ([5], [0, 1, 2, -7, 2**31 - 1], [3])  # seed, row keys, step
# A simple chat template for the demo tokenizer, which has none.
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }} : {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}verdict :{% endif %}")
PROMPTS = [TEMPLATE.format(prompt=text, response="").rstrip() for text in (
    "the coffee was great.", "loved it.", "a boring film, slow and long, with a weak ending.")]
CHAT = [{"role": "review", "content": "the coffee was great."}]

SETTINGS = [
    {"temperature": 0.7},
    {"top_k": 5},
    {"top_k": 100},  # more than the vocabulary: every token stays
    {"top_p": 0.8},
    {"top_p": 1.0},
    {"min_p": 0.2},
    {"repetition_penalty": 1.3},
    {"repetition_penalty": 1.3, "temperature": 1.5, "top_k": 12, "top_p": 0.9, "min_p": 0.05},
]


def transformers_scores(logits, input_ids, settings: dict):
    """What transformers' own processors make of `logits`, in `generate`'s order."""
    from transformers import (
        MinPLogitsWarper,
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    made = [(RepetitionPenaltyLogitsProcessor, "repetition_penalty", "penalty"),
            (TemperatureLogitsWarper, "temperature", "temperature"),
            (TopKLogitsWarper, "top_k", "top_k"), (TopPLogitsWarper, "top_p", "top_p"),
            (MinPLogitsWarper, "min_p", "min_p")]
    scores = logits.clone()
    for cls, name, argument in made:
        if name in settings:
            scores = cls(**{argument: settings[name]})(input_ids, scores)
    return scores


@pytest.mark.parametrize("settings", SETTINGS)
def test_the_processors_score_as_transformers_does(settings):
    import torch

    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(6, VOCAB, generator=generator) * 3
    input_ids = torch.randint(0, VOCAB, (6, 9), generator=generator)
    ours = generation.processed_logits(
        logits, GenerationOptions(do_sample=True, **settings),
        generation.seen_tokens(input_ids, torch.ones_like(input_ids), VOCAB))
    theirs = transformers_scores(logits, input_ids, settings)
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
    finite = ~torch.isinf(theirs)
    torch.testing.assert_close(ours[finite], theirs[finite], rtol=1e-6, atol=1e-6)


def test_draws_follow_transformers_distribution_and_repeat_with_the_seed():
    """20000 draws of one row at a fixed seed: each token's frequency within 4.5 standard
    errors (+0.001) of transformers' processed softmax; removed tokens never drawn."""
    import torch

    settings = {"temperature": 0.8, "top_k": 10, "top_p": 0.95}
    logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(1)) * 2
    expected = transformers_scores(logits, torch.zeros(1, 1, dtype=torch.long),
                                   settings).softmax(-1)[0].double()
    options = GenerationOptions(do_sample=True, **settings)
    draws, n = [], 20000
    for step in range(4):  # over steps and row keys: the noise is fresh for each
        keys = torch.arange(n // 4, dtype=torch.int32) + step * 7919
        draws.append(generation.next_tokens(logits.expand(n // 4, -1), options, None,
                                          torch.tensor([7]), keys, torch.tensor([step]))[:, 0])
    counts = torch.bincount(torch.cat(draws), minlength=VOCAB).double() / n
    tolerance = 4.5 * (expected * (1 - expected) / n).sqrt() + 1e-3
    assert bool(((counts - expected).abs() <= tolerance).all()), (counts, expected)
    assert counts[expected == 0].sum() == 0

    def draw(seed):
        return generation.next_tokens(logits.expand(64, -1), options, None, torch.tensor([seed]),
                                    torch.arange(64, dtype=torch.int32), torch.tensor([0]))

    assert torch.equal(draw(3), draw(3)) and not torch.equal(draw(3), draw(4))


@pytest.fixture(scope="module")
def chat_tokenizer(lm_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(lm_dir)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


@pytest.mark.parametrize("options, message", [
    ({"do_sample": True, "top_p": 0.0}, "top_p must be in (0, 1]"),
    ({"do_sample": True, "top_p": 1.5}, "top_p must be in (0, 1]"),
    ({"do_sample": True, "temperature": 0.0}, "pass a temperature > 0"),
    ({"num_return_sequences": 2}, "pass do_sample=True to draw different answers"),
    ({"max_new_tokens": 120}, "the model has 128. Pass a smaller max_new_tokens"),
    ({"frequency": 2}, "predict does not take frequency; it takes do_sample"),
])
def test_bad_options_are_refused_before_forking(lm_dir, options, message, monkeypatch):
    refuse_launches(monkeypatch)
    with pytest.raises(FineTuneError) as raised:
        hx.predict(lm_dir, PROMPTS, num_processes=4, **options)
    assert message in str(raised.value)
    assert not _xla.runtime_is_initialized()


def test_messages_need_a_chat_template(lm_dir, chat_tokenizer, monkeypatch):
    from transformers import AutoTokenizer

    refuse_launches(monkeypatch)
    with pytest.raises(FineTuneError, match="messages need a chat template"):
        hx.predict(lm_dir, CHAT, num_processes=4)
    with pytest.raises(GenerationError, match="messages need a chat template"):
        prompt_rows(AutoTokenizer.from_pretrained(lm_dir), messages=CHAT)
    # With a template: the assistant's turn is opened, no beginning-of-text token added.
    (row,) = prompt_rows(chat_tokenizer, messages=[CHAT])
    assert chat_tokenizer.decode(row).endswith("verdict :")
    assert prompt_rows(chat_tokenizer, CHAT) == [row]  # a chat given as prompts, as predict
    assert not _xla.runtime_is_initialized()


@pytest.mark.launch
def test_the_cpu_path_is_transformers_greedy_and_cuts_at_stop_strings(lm_dir):
    """`FineTuneResult.generate`'s engine on the CPU: transformers' greedy tokens."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hfxla_nb.train.worker.generation import cpu_hooks, generate_rows, texts_of

    tokenizer = AutoTokenizer.from_pretrained(lm_dir)
    model = AutoModelForCausalLM.from_pretrained(lm_dir).eval()
    rows = prompt_rows(tokenizer, PROMPTS)
    options = resolve_options(tokenizer, None, 8)
    with torch.no_grad():
        ours = generate_rows(model, tokenizer, rows, options, 16, cpu_hooks(tokenizer))
        for row, tokens in zip(rows, ours.tokens.tolist(), strict=True):
            theirs = model.generate(torch.tensor([row]), attention_mask=torch.ones(1, len(row)),
                                    max_new_tokens=8, do_sample=False,
                                    pad_token_id=tokenizer.pad_token_id)[0, len(row):]
            assert tokens == theirs.tolist()
    texts = texts_of(tokenizer, ours.tokens, options, len(rows))
    word = texts[0].split()[1]
    cut = texts_of(tokenizer, ours.tokens, resolve_options(tokenizer, None, 8,
                                                           stop_strings=[word]), len(rows))
    assert cut[0] == texts[0][:texts[0].index(word)]


@pytest.fixture(scope="module")
def chat_dir(lm_dir, chat_tokenizer, tmp_path_factory):
    """The demo Llama's folder with a chat template saved beside it."""
    import shutil

    folder = tmp_path_factory.mktemp("chat") / "llama"
    shutil.copytree(lm_dir, folder)
    chat_tokenizer.save_pretrained(folder)
    return str(folder)


def cpu_call(call: dict) -> dict:
    """A call's options for `result.generate` on the CPU, in this process (streaming is the
    worker's)."""
    return {**{k: v for k, v in call.items() if k != "stream"}, "device": "cpu"}


def kernel_result(folder):
    """A `FineTuneResult` for a saved causal LM (not warm: its `generate` launches a worker,
    or runs on the CPU here with `device="cpu"`)."""
    from hfxla_nb.train import FineTuneResult

    return FineTuneResult(
        output_dir=str(folder), loss_history=[], metrics={}, steps=0, epochs=0.0,
        samples_per_second=None, train_seconds=0.0, compiles=0, eval_compiles=0,
        executions_per_step=None, transfers_per_step=None, label_names=[], strategy="spmd",
        devices=1, precision="fp32", bucket_lengths=[64], task="causal-lm")


@pytest.mark.launch
def test_result_generate_refuses_in_the_kernel(lm_dir):
    result = kernel_result(lm_dir)
    with pytest.raises(GenerationError, match="messages need a chat template"):
        result.generate(messages=CHAT)
    with pytest.raises(GenerationError, match="top_p must be in"):
        result.generate(PROMPTS, do_sample=True, top_p=0.0)
    with pytest.raises(GenerationError, match="the model has 128"):
        result.generate(PROMPTS, max_new_tokens=125)
    assert not _xla.runtime_is_initialized()


@pytest.fixture(scope="module")
def launched(chat_dir):
    """One launch, every `hx.generate` call of the tests below, each with the graphs it
    compiled and the executions it ran (torch_xla's metrics, in the worker)."""
    result = kernel_result(chat_dir)
    greedy = result.generate(PROMPTS, max_new_tokens=8)  # on the CPU, in the kernel
    tokenizer = result.load_tokenizer()
    first = sorted({tokenizer(text.split()[0], add_special_tokens=False)["input_ids"][0]
                    for text in greedy})
    stops = sorted({text.split()[1] for text in greedy})
    calls = {
        "greedy": {"prompts": PROMPTS, "max_new_tokens": 8},
        "drawn": {"prompts": PROMPTS, "max_new_tokens": 8, "do_sample": True, "top_k": 8,
                  "temperature": 0.9, "repetition_penalty": 1.2, "seed": 5,
                  "num_return_sequences": 2},
        "other seed": {"prompts": PROMPTS, "max_new_tokens": 8, "do_sample": True, "top_k": 8,
                       "temperature": 0.9, "repetition_penalty": 1.2, "seed": 6,
                       "num_return_sequences": 2},
        "ended": {"prompts": PROMPTS, "max_new_tokens": 40, "check_every": 4,
                  "eos_token_id": first},
        "stopped": {"prompts": PROMPTS, "max_new_tokens": 40, "check_every": 4,
                    "stop_strings": stops},
        "chat": {"messages": [CHAT, [{"role": "review", "content": "loved it."}]],
                 "max_new_tokens": 6},
    }
    calls["drawn again"] = calls["drawn"]
    calls["longer"] = {"prompts": PROMPTS, "max_new_tokens": 24}
    for options in calls.values():
        options["stream"] = False  # only "streamed" below sends its text as it comes
    calls["streamed"] = {"prompts": PROMPTS[:1], "max_new_tokens": 12, "check_every": 4}

    def work():
        import torch_xla.debug.metrics as met

        def count(name):
            data = met.metric_data(name)
            return data[0] if data else 0

        def traced():  # operations traced on XLA, each counted by torch_xla (`xla::add`...)
            return sum(met.counter_value(name) or 0 for name in met.counter_names()
                       if name.startswith("xla::"))

        import torch

        from hfxla_nb.train.worker import generation
        from hfxla_nb.train.worker.generation import uniform_noise

        device = _xla.device()
        out = {"noise": uniform_noise(*(torch.tensor(v, dtype=torch.int32).to(device)
                                        for v in NOISE_INPUTS), VOCAB).cpu()}
        bar: list = []  # the "tokens" bar's events of the call, as the panel gets them
        sent = generation.emit
        generation.emit = lambda event: (bar.append(event), sent(event))[1]
        for name, options in calls.items():
            compiles, executions = count("CompileTime"), count("ExecuteTime")
            ops = traced()
            bar.clear()
            texts = hx.generate(chat_dir, **options)
            out[name] = (texts, count("CompileTime") - compiles,
                         count("ExecuteTime") - executions)
            out["traced", name] = traced() - ops
            out["bar", name] = [event for event in bar if getattr(event, "label", "") == "tokens"]
        return out

    out = hx.notebook_launcher(work, progress=False)
    out["events"] = hx.last_launch().streamed
    return result, calls, out


@pytest.mark.launch
def test_greedy_on_xla_is_the_kernels_greedy_in_two_graphs(launched):
    result, calls, out = launched
    texts, compiles, executions = out["greedy"]
    assert texts == result.generate(**cpu_call(calls["greedy"]))
    # The prompt's graph and one step's; 8 tokens: the prompt's execution and 7 steps'.
    assert (compiles, executions) == (2, 8)
    chat, compiles, _ = out["chat"]
    assert chat == result.generate(**cpu_call(calls["chat"])) and compiles == 2
    assert not _xla.runtime_is_initialized()


@pytest.mark.launch
def test_a_later_token_runs_the_compiled_step_and_traces_no_model_operation(launched):
    """The decoding step is traced once per call (`StepGraph`); every later token runs its
    compiled graph: 16 more tokens trace only their two position tensors and a check, not
    the model's few hundred operations a step."""
    result, calls, out = launched
    greedy, longer = out["greedy"][0], out["longer"][0]
    assert all(long.startswith(short) for short, long in zip(greedy, longer, strict=True))
    assert out["longer"][1] == 2  # its own two (the token buffer's length is a shape)
    per_step = out["traced", "greedy"] / 2  # the prompt's trace and the first step's
    extra = out["traced", "longer"] - out["traced", "greedy"]
    assert per_step > 200 and extra < 16 * 12, (per_step, extra)


@pytest.mark.launch
def test_draws_repeat_with_the_seed_and_compile_nothing_new(launched):
    result, calls, out = launched
    drawn, compiles, _ = out["drawn"]
    # The kernel's CPU draws the same: the same noise, and logits close enough here.
    assert result.generate(**cpu_call(calls["drawn"])) == drawn
    assert len(drawn) == len(PROMPTS) and all(len(answers) == 2 for answers in drawn)
    assert compiles == 2
    assert out["drawn again"][:2] == (drawn, 0)  # the same seed: the same texts, cached graphs
    other, compiles, _ = out["other seed"]
    assert other != drawn and compiles == 0  # the seed is graph data


@pytest.mark.launch
def test_short_answers_stop_early_in_the_same_two_graphs(launched):
    result, calls, out = launched
    # Every row ends at its first token: the check after 4 tokens stops the loop, so 4
    # executions (the prompt's and 3 steps), not 40.
    texts, compiles, executions = out["ended"]
    assert (compiles, executions) == (2, 4)
    assert texts == [""] * len(PROMPTS) == result.generate(**cpu_call(calls["ended"]))
    texts, compiles, executions = out["stopped"]
    assert texts == result.generate(**cpu_call(calls["stopped"]))  # cut at the stop string
    # As many executions as the CPU path's steps: they stop at the same check.
    assert compiles == 0 and executions == cpu_steps(result, cpu_call(calls["stopped"])) < 40
    assert all(not any(stop in text for stop in calls["stopped"]["stop_strings"])
               for text in texts)


@pytest.mark.launch
def test_a_decoding_has_a_tokens_bar_that_says_compiling_then_ends_where_decoding_did(launched):
    """A generation is not a silent "running": its "tokens" bar comes before the first token,
    so the panel says its first step compiles; it ends at the tokens decoded, done early
    where every row ended."""
    from hfxla_nb.train.worker.generation import TokenBar
    from hfxla_nb.ui import text
    from hfxla_nb.ui.state import LaunchState

    _, _, out = launched
    greedy, ended = out["bar", "greedy"], out["bar", "ended"]
    assert [(e.step, e.total, e.ended) for e in (greedy[0], greedy[-1])] == [
        (0, 8, None), (8, 8, None)]
    assert [(e.step, e.total, e.ended) for e in (ended[0], ended[-1])] == [
        (0, 40, None), (4, 40, TokenBar.ENDED)]
    state = LaunchState(1)
    state.handle(ended[0])
    (bar,) = state.view().bars
    assert text.timing_parts(bar)[0].startswith("compiling the first step")
    for event in ended[1:]:
        state.handle(event)
    (bar,) = state.view().bars
    assert bar.state == "done" and "4/40 · stopped early" in text.bar_line(bar)


def cpu_steps(result, call: dict) -> int:
    """The steps `result.generate` runs for `call` on the CPU (every row has ended by then)."""
    import torch

    from hfxla_nb.train.worker.generation import cpu_hooks, generate_rows

    tokenizer, model = result.load_tokenizer(), result.load_model().eval()
    options = {k: v for k, v in call.items() if k != "device"}
    rows = prompt_rows(tokenizer, options.pop("prompts"))
    settings = resolve_options(tokenizer, None, options.pop("max_new_tokens"), **options)
    with torch.no_grad():
        return generate_rows(model, tokenizer, rows, settings, 16, cpu_hooks(tokenizer)).steps


@pytest.mark.launch
def test_predict_stops_early_with_two_graphs_per_bucket(launched, chat_dir):
    """`predict` on 4 devices: chats and prompts, greedy, every row ending at its first token:
    each batch stops at its first check, in the prompt's graph and one step's per bucket."""
    result, calls, _ = launched
    options = {k: v for k, v in calls["ended"].items() if k not in ("prompts", "stream")}
    out = hx.predict(chat_dir, [*PROMPTS, CHAT], batch_size=4, num_processes=4, progress=False,
                     **options)
    executions = hx.last_launch().ranks[0].metrics.executions
    assert out.compiles == 2 * len(out.bucket_lengths)
    assert [item["generated_text"] for item in out][:3] == [""] * 3
    assert out[3]["generated_text"] == result.generate(messages=CHAT, device="cpu",
                                                       **options)[0]
    assert executions == 4 * len(out.bucket_lengths), executions  # not 40 per batch


@pytest.mark.launch
def test_streaming_sends_the_new_text_every_check(launched):
    """`stream=True` (the default): the new text every `check_every` tokens and at the end,
    as `Generated` events (the cell prints them); `stream=False` calls send none."""
    _, _, out = launched
    (text,), _, _ = out["streamed"]
    events = out["events"]
    assert [event.step for event in events] == [4, 8, 12]
    assert [event.done for event in events] == [False, False, True]
    assert "".join(event.texts[0] for event in events) == text


def test_a_streamed_prompt_is_shown_as_written_not_as_an_uncased_tokenizer_decodes_it():
    from hfxla_nb.train.worker.generation import shown_prompts

    assert shown_prompts("The Food was") == ["The Food was"]
    assert shown_prompts(["A", "b  c"]) == ["A", "b  c"]
    assert shown_prompts(None) is None  # chat messages: their rendering is shown


@pytest.mark.launch
def test_the_panel_draws_each_prompt_with_its_streamed_text_under_the_bars(launched):
    """The generation's first event names its prompt, as the user wrote it; a panel fed the
    launch's real events shows the prompt, then the text so far (a cursor until it ends), in
    HTML and in text, and the launcher prints nothing of it where the panel draws it."""
    from hfxla_nb.ui import html, text
    from hfxla_nb.ui.state import LaunchState

    _, _, out = launched
    (answer,), _, _ = out["streamed"]
    events = out["events"]
    (prompt,) = events[0].prompts
    assert prompt == PROMPTS[0] and all(not event.prompts for event in events[1:])
    state = LaunchState(1)
    state.handle(events[0])
    (row,) = state.view().generations
    assert (row.prompt, row.text, row.done) == (prompt, events[0].texts[0], False)
    assert text.generation_lines([row])[1].endswith(text.CURSOR)
    for event in events[1:]:
        state.handle(event)
    view = state.view()
    (row,) = view.generations
    assert (row.text, row.done) == (answer, True)
    lines = text.launch_text(view).splitlines()
    prompt_line = lines.index(f"> {text.prompt_tail(prompt)}")
    assert lines[prompt_line + 1] == "  " + " ".join(answer.split("\n"))
    drawn = html.launch_html(view)
    assert 'class="hfxla-generations"' in drawn and text.CURSOR not in drawn
    generations = drawn[drawn.index("hfxla-generations"):]
    assert generations.index("coffee") < generations.index(html.escape(answer.strip()))


@pytest.mark.launch
def test_result_generate_streams_on_the_cpu_as_the_launch_prints(launched, capsys):
    """`result.generate(stream=True)` prints what `hx.generate`'s launch prints: the same
    pieces, the text whole with its newline at the end."""
    result, calls, out = launched
    capsys.readouterr()
    (text,) = result.generate(stream=True, device="cpu", **calls["streamed"])
    assert capsys.readouterr().out == "".join(event.shown() for event in out["events"])
    assert capsys.readouterr().out == "" and text == out["streamed"][0][0]


@pytest.mark.launch
def test_result_generate_names_the_options_it_takes(lm_dir):
    with pytest.raises(GenerationError, match="generate\\(\\) does not take frequency"):
        kernel_result(lm_dir).generate(PROMPTS, frequency=2)


@pytest.mark.launch
def test_predict_draws_what_generate_draws_with_the_seed(launched, chat_dir):
    """The same seed, the same answers: 4 devices and batches of 4 rows in `predict`, one
    device and one batch in `hx.generate` (a row's draws are keyed by its prompt's index)."""
    _, calls, out = launched
    options = {k: v for k, v in calls["drawn"].items() if k not in ("prompts", "stream")}
    predicted = hx.predict(chat_dir, PROMPTS, batch_size=4, num_processes=4, progress=False,
                           **options)
    assert [item["generated_text"] for item in predicted] == out["drawn"][0]
    assert predicted.compiles == 2 * len(predicted.bucket_lengths)


@pytest.mark.launch
def test_the_noise_on_xla_is_the_noise_on_the_cpu(launched):
    """The hash's int32 ops give the same bits on both (torch_xla's `>>` of a negative
    int32 differs from the CPU's: the hash shifts only non-negative values)."""
    import torch

    cpu = generation.uniform_noise(*(torch.tensor(v, dtype=torch.int32) for v in NOISE_INPUTS),
                                 VOCAB)
    assert torch.equal(launched[2]["noise"], cpu)
