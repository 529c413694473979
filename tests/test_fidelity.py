"""Real notebooks run unchanged: imports at the top of the notebook, the function in a later
cell, tqdm bound by a cell or by a library, accelerate's way of writing a training function.

Each test runs cells in a real kernel and reads the kernel's own log too: a forked worker must
never send on the kernel's sockets ("attempted to send message from fork").
"""

from __future__ import annotations

import textwrap

import pytest

from tests.helpers import Kernel, kernel_fixture

pytestmark = pytest.mark.kernel

# A kernel per test; a forked worker never sends on its sockets (ipykernel would log it).
kernel = kernel_fixture(scope="function", fork_quiet=True)


def cells(kernel: Kernel, *sources: str, timeout: float = 240):
    outputs = []
    for source in sources:
        output = kernel.run(textwrap.dedent(source), timeout=timeout)
        assert output.error is None, "\n".join((output.error or {}).get("traceback", []))
        outputs.append(output)
    return outputs


def test_every_tqdm_reaches_the_panel_whoever_imported_it(kernel):
    imports, _, shown = cells(
        kernel,
        """
        import time
        from tqdm.auto import tqdm, trange
        from tqdm import tqdm as plain_tqdm
        import tqdm.notebook as tqdm_notebook
        import datasets
        import transformers
        from huggingface_hub.utils import tqdm as hub_tqdm
        import hfxla_nb as hx
        print(tqdm.__module__, type(tqdm).__name__)
        """,
        """
        def train(index):
            for _ in tqdm(range(20), desc="epoch"):
                time.sleep(0.01)
            for _ in trange(6, desc="trange"):
                pass
            for _ in plain_tqdm(range(7), desc="plain"):
                pass
            for _ in tqdm_notebook.tqdm(range(5), desc="notebook"):
                pass
            for _ in hub_tqdm(range(4), desc="hub"):
                pass
            data = datasets.Dataset.from_dict({"x": list(range(50))})
            data.map(lambda row: row, desc="datasets map")
            return "done"

        hx.notebook_launcher(train)
        """,
        "print(sorted(hx.last_launch().ranks[0].bars.items()))",
    )
    assert imports.stdout.startswith("tqdm.auto")  # the notebook's own bar class
    bars = dict(eval(shown.stdout.strip()))  # noqa: S307 - our own repr of plain tuples
    for label, total in (("epoch", 20), ("trange", 6), ("plain", 7), ("notebook", 5),
                         ("hub", 4), ("datasets map", 50)):
        assert bars.get(label) == (total, total), (label, bars)


ACCELERATE_IMPORTS = """
    # The first cell of Hugging Face's accelerate example notebooks, with a locally built model.
    import torch
    from torch.utils.data import DataLoader
    from tqdm.auto import tqdm
    from accelerate import Accelerator
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from hfxla_nb.demo import demo_dataset, demo_model_dir
    import hfxla_nb as hx

    MODEL = demo_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    raw = demo_dataset(n=160)

    def encode(split):
        encoded = tokenizer(list(raw[split]["text"]), padding="max_length", max_length=32,
                            truncation=True, return_tensors="pt")
        labels = torch.tensor(list(raw[split]["label"]))
        return [dict(input_ids=i, attention_mask=m, labels=l)
                for i, m, l in zip(encoded["input_ids"], encoded["attention_mask"], labels)]
"""

ACCELERATE_FUNCTION = """
    def training_function(epochs=2):
        accelerator = Accelerator()
        train = DataLoader(encode("train"), batch_size=16, shuffle=True, drop_last=True)
        valid = DataLoader(encode("validation"), batch_size=16)
        model = AutoModelForSequenceClassification.from_pretrained(MODEL)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model, optimizer, train, valid = accelerator.prepare(model, optimizer, train, valid)
        for epoch in range(epochs):
            model.train()
            for batch in tqdm(train, desc=f"epoch {epoch}",
                              disable=not accelerator.is_local_main_process):
                loss = model(**batch).loss
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            model.eval()
            correct = total = 0
            for batch in valid:
                with torch.no_grad():
                    predictions = model(**batch).logits.argmax(-1)
                predictions, labels = accelerator.gather_for_metrics(
                    (predictions, batch["labels"]))
                correct += (predictions == labels).sum().item()
                total += labels.numel()
            accelerator.print(f"epoch {epoch}: accuracy {correct / total:.2f} on {total} rows")
        return {"main": accelerator.is_main_process,
                "local_main": accelerator.is_local_main_process,
                "processes": accelerator.num_processes}
"""


@pytest.mark.launch
def test_an_accelerate_notebook_function_runs_unchanged(kernel):
    _, _, launched = cells(
        kernel,
        ACCELERATE_IMPORTS,
        ACCELERATE_FUNCTION,
        "print('VALUE', hx.notebook_launcher(training_function))",
    )
    for epoch in (0, 1):  # accelerator.print reaches the cell, once per epoch
        assert launched.stdout.count(f"epoch {epoch}: accuracy") == 1, launched.stdout
    assert "on 16 rows" in launched.stdout  # gather_for_metrics: every validation row, once
    assert "VALUE {'main': True, 'local_main': True, 'processes': 1}" in launched.stdout
    (bars,) = cells(kernel, "print(sorted(hx.last_launch().ranks[0].bars))")
    assert "'epoch 0'" in bars.stdout and "'epoch 1'" in bars.stdout


def test_environment_mistakes_are_refused_before_forking(kernel):
    (refusals,) = cells(
        kernel,
        """
        import os
        import hfxla_nb as hx
        from hfxla_nb import LaunchRefusedError

        def refusal(**variables):
            saved = {name: os.environ.get(name) for name in variables}
            os.environ.update(variables)
            try:
                hx.notebook_launcher(lambda: print("ran"))
            except LaunchRefusedError as error:
                return str(error)
            finally:
                for name, value in saved.items():
                    os.environ.pop(name) if value is None else os.environ.update({name: value})

        print("1>", refusal(CPU_NUM_DEVICES="abc"))
        print("2>", refusal(PJRT_DEVICE="TPU"))
        print("LAST", hx.last_launch())
        """,
    )
    lines = dict(line.split("> ", 1) for line in refusals.stdout.splitlines() if "> " in line)
    assert "CPU_NUM_DEVICES='abc' is not a positive integer" in lines["1"]
    assert "hx.configure(device='cpu', cores=N)" in lines["1"]
    assert "PJRT_DEVICE=TPU, but this machine has no TPU" in lines["2"]
    assert "LAST None" in refusals.stdout and "ran" not in refusals.stdout
