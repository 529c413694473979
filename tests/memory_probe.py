"""The kernel's peak memory while data is prepared, measured in a fresh process.

`python tests/memory_probe.py MODE ROWS [MAX_LENGTH [CACHE]]` prints one JSON line: `peak_mb` (the
process's peak resident memory, `ru_maxrss`), `base_mb` (resident memory once every module
is imported and the tokenizer is loaded, before the data is made) and `seconds`. MODE:

- `map`: `datasets.map` (the tokenizer, batched) then padded arrays of every row
  (`with_format("numpy")`): what a fixed-shape pipeline of one's own holds;
- `prepare`: `prepare_fine_tune` of the demo classifier on the same rows (`max_length`:
  one bucket, the same padding);
- `stream`: `prepare_fine_tune` of a streamed corpus of ROWS rows (`IterableDataset`) for the
  demo causal LM: nothing is read in the kernel but the rows it peeks at.

Each mode runs in its own process so that one's peak is not another's.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time


def resident_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main(mode: str, rows: int, max_length: int = 64, cache: str | None = None) -> dict:
    import datasets
    import numpy as np
    from transformers import AutoTokenizer

    from hfxla_nb.demo import demo_model_dir, demo_texts
    from hfxla_nb.demo.lm import demo_lm_model_dir
    from hfxla_nb.train.prepare import prepare_fine_tune

    datasets.disable_progress_bars()
    folder = demo_lm_model_dir(cache=cache) if mode == "stream" else demo_model_dir(cache=cache)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    base = resident_mb()
    start = time.perf_counter()
    if mode == "stream":
        def rows_of(count):
            texts, _ = demo_texts(min(count, 1000), 0, 2)
            for i in range(count):
                yield {"text": texts[i % len(texts)]}

        stream = datasets.IterableDataset.from_generator(rows_of, gen_kwargs={"count": rows})
        plan = prepare_fine_tune(folder, stream, task="causal-lm", max_steps=10,
                                 max_length=max_length, output_dir=None, batch_size=8)
        held = plan.total_steps
    else:
        texts, labels = demo_texts(rows, 0, 2)
        features = datasets.Features({"text": datasets.Value("string"),
                                      "label": datasets.ClassLabel(names=["negative",
                                                                          "positive"])})
        dataset = datasets.Dataset.from_dict({"text": texts, "label": labels},
                                             features=features)
        del texts, labels
        if mode == "map":
            mapped = dataset.map(
                lambda batch: tokenizer(batch["text"], truncation=True, max_length=max_length,
                                        padding="max_length"),
                batched=True, remove_columns=["text"])
            arrays = mapped.with_format("numpy")
            held = [np.asarray(arrays[name]) for name in mapped.column_names]
        else:
            held = prepare_fine_tune(folder, dataset, max_length=max_length, output_dir=None,
                                     batch_size=32, epochs=1)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    del held
    return {"mode": mode, "rows": rows, "peak_mb": round(peak, 1), "base_mb": round(base, 1),
            "seconds": round(seconds, 2)}


if __name__ == "__main__":
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    arguments = sys.argv[1:]
    print(json.dumps(main(arguments[0], int(arguments[1]), *map(int, arguments[2:3]),
                          *arguments[3:4])))
