"""Training and evaluation data for `fine_tune`: any supported input to a `datasets.Dataset`,
splits, columns, texts and labels checked, each refusal saying what to change.

Runs in the notebook kernel before a worker is forked; fixed-shape batching is `batching.py`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

#: Split names tried, in order, for evaluation when a DatasetDict is given.
EVAL_SPLITS = ("validation", "valid", "eval", "dev", "test")
_FILE_BUILDERS = {
    ".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet",
    ".arrow": "arrow", ".txt": "text",
}


class DataError(ValueError):
    """The data cannot be used as given; the message says what to change."""


# ---------------------------------------------------------------------------------------------
# Any supported input -> datasets.Dataset
# ---------------------------------------------------------------------------------------------


def to_dataset(data: Any, what: str = "dataset"):
    """Turn `data` into a `datasets.Dataset` or `DatasetDict`.

    Accepted: `datasets.Dataset` / `DatasetDict`, a pandas `DataFrame`, a list of dicts, a dict
    of lists, a local file (csv, tsv, json, jsonl, parquet, arrow, txt), a folder (written by
    `save_to_disk`, or data files `load_dataset` understands), or a dataset name on the Hub.
    """
    import datasets

    if isinstance(data, (datasets.Dataset, datasets.DatasetDict)):
        return data
    if isinstance(data, datasets.IterableDataset | datasets.IterableDatasetDict):
        return data  # streamed: read as training consumes it (`pick_splits`, `peek`)
    if type(data).__name__ == "DataFrame" and hasattr(data, "to_dict"):
        try:
            return datasets.Dataset.from_pandas(data, preserve_index=False)
        except Exception as error:  # noqa: BLE001
            columns = {str(name): list(data[name]) for name in data.columns}
            raise DataError(_conversion_message(what, "DataFrame", columns, error)) from None
    if isinstance(data, Mapping):
        try:
            return datasets.Dataset.from_dict(dict(data))
        except Exception as error:  # noqa: BLE001 - arrow's message is the useful part
            columns = {str(k): list(v) if isinstance(v, (list, tuple)) else [v]
                       for k, v in data.items()}
            raise DataError(_conversion_message(what, "dict", columns, error)) from None
    if isinstance(data, (list, tuple)):
        if not data:
            raise DataError(f"{what} is empty: pass at least one row.")
        if not all(isinstance(row, Mapping) for row in data):
            kinds = sorted({type(row).__name__ for row in data if not isinstance(row, Mapping)})
            raise DataError(
                f"{what} is a list, but not of dicts (found {', '.join(kinds)}). Pass rows as "
                "dicts such as [{'text': 'great movie', 'label': 'positive'}, ...]."
            )
        try:
            return datasets.Dataset.from_list([dict(row) for row in data])
        except Exception as error:  # noqa: BLE001
            names = list(dict.fromkeys(key for row in data for key in row))
            columns = {str(name): [row.get(name) for row in data] for name in names}
            raise DataError(_conversion_message(what, "rows", columns, error)) from None
    if isinstance(data, (str, os.PathLike)):
        return _load(os.fspath(data), what)
    raise DataError(
        f"{what} has an unsupported type {type(data).__name__}. Pass a datasets.Dataset or "
        "DatasetDict, a pandas DataFrame, a list of dicts, a local data file or folder, or a "
        "dataset name on the Hugging Face Hub."
    )


def _conversion_message(what: str, form: str, columns: Mapping[str, list], error) -> str:
    """Why a table could not be built: usually a column that mixes value types."""
    for name, values in columns.items():
        seen: dict[str, int] = {}
        for row, value in enumerate(values):
            if value is not None:
                seen.setdefault(value_kind(value), row)
        if len(seen) > 1:
            examples = ", ".join(
                f"{kind} (row {row}: {short(values[row])})" for kind, row in seen.items()
            )
            return (
                f"{what}: column {name!r} mixes types: {examples}. Use one type per column: "
                "for labels, either class names (strings) or class ids (integers 0..N-1); for "
                "text, strings."
            )
    return f"{what}: could not make a dataset from the {form}: {error}"


def _load(source: str, what: str):
    import datasets

    path = os.path.expanduser(source)
    try:
        if os.path.isfile(path):
            extension = os.path.splitext(path)[1].lower()
            builder = _FILE_BUILDERS.get(extension)
            if builder is None:
                raise DataError(
                    f"{what}: {path} has the extension {extension or '(none)'!r}; use one of "
                    f"{', '.join(sorted(_FILE_BUILDERS))}."
                )
            kwargs = {"delimiter": "\t"} if extension == ".tsv" else {}
            return datasets.load_dataset(builder, data_files=path, **kwargs)
        if os.path.isdir(path):
            if os.path.exists(os.path.join(path, "dataset_dict.json")) or os.path.exists(
                os.path.join(path, "state.json")
            ):
                return datasets.load_from_disk(path)
            return datasets.load_dataset(path)
        return datasets.load_dataset(source)
    except DataError:
        raise
    except Exception as error:  # noqa: BLE001 - add what to do to whatever went wrong
        hint = (
            "It is neither a local file nor a folder, so it was looked up on the Hugging Face "
            "Hub; check the name and the network, or pass a local file, a folder, or a "
            "datasets.Dataset."
            if not os.path.exists(path)
            else "Check the file's format."
        )
        raise DataError(f"{what}: could not load {source!r}: {error}. {hint}") from None


#: Rows of a streamed evaluation split that are evaluated (read in the kernel, in memory).
STREAMED_EVAL_ROWS = 1000
#: Rows of a streamed training split read in the kernel to check its columns, texts and labels
#: and to choose the row length.
PEEK_ROWS = 1000


def is_stream(data: Any) -> bool:
    """Whether `data` is a streamed dataset (`load_dataset(..., streaming=True)`, an
    `IterableDataset` or `IterableDatasetDict`): its rows are read as they are used."""
    import sys

    datasets = sys.modules.get("datasets")  # not imported: nothing can be a stream of it
    return datasets is not None and isinstance(
        data, datasets.IterableDataset | datasets.IterableDatasetDict)


def peek(stream, rows: int = PEEK_ROWS, what: str = "the streamed training data"):
    """The first `rows` rows of a streamed split as an in-memory `datasets.Dataset` (its
    features kept when the stream knows them), refused when it has none."""
    import datasets

    try:
        first = list(stream.take(rows))
    except Exception as error:  # noqa: BLE001 - reading is where a bad stream shows
        raise DataError(f"could not read {what}: {error}") from None
    if not first:
        raise DataError(f"{what} is empty: it needs at least one row.")
    features = getattr(stream, "features", None)
    try:
        return datasets.Dataset.from_list(first, features=features)
    except Exception:  # noqa: BLE001 - features the rows do not match: let the rows say
        return datasets.Dataset.from_list(first)


def columns_of(dataset) -> list[str]:
    """A split's column names; a stream that does not know them says them with its first
    row (read here)."""
    names = getattr(dataset, "column_names", None)
    if names:
        return list(names)
    if is_stream(dataset):
        first = next(iter(dataset.take(1)), None)
        return list(first) if first else []
    return []


def pick_splits(data: Any, eval_data: Any = None) -> tuple[Any, Any, str | None]:
    """The training `Dataset`, the evaluation `Dataset` (or None) and the evaluation split's
    name, from what the user passed.

    A streamed training split (`IterableDataset`) is returned as it is: it is read as
    training consumes it. A streamed evaluation split is read here, its first
    `STREAMED_EVAL_ROWS` rows (evaluation runs over rows in memory)."""
    import datasets

    data = to_dataset(data)
    eval_name = None
    if isinstance(data, datasets.IterableDatasetDict):
        data = datasets.DatasetDict(data)  # the same split names, each still a stream
    if isinstance(data, datasets.DatasetDict):
        if "train" not in data:
            raise DataError(
                f"the DatasetDict has no 'train' split (it has: {', '.join(data) or 'none'}). "
                "Pass dataset=ds['<split>'] and eval_dataset=ds['<other split>']."
            )
        splits = data
        data = splits["train"]
        if eval_data is None:
            eval_name = next((name for name in EVAL_SPLITS if name in splits), None)
            eval_data = splits[eval_name] if eval_name else None
    if eval_data is not None:
        eval_data = to_dataset(eval_data, "eval_dataset")
        if isinstance(eval_data, datasets.IterableDatasetDict):
            eval_data = datasets.DatasetDict(eval_data)
        if isinstance(eval_data, datasets.DatasetDict):
            name = next((n for n in EVAL_SPLITS if n in eval_data), None)
            if name is None:
                raise DataError(
                    "eval_dataset is a DatasetDict without a validation or test split (it "
                    f"has: {', '.join(eval_data)}). Pass one split: eval_dataset=ds['<split>']."
                )
            eval_data = eval_data[name]
        if is_stream(eval_data):
            eval_data = peek(eval_data, STREAMED_EVAL_ROWS, "the streamed evaluation data")
        eval_name = eval_name or "eval"
    return data, eval_data, eval_name


# ---------------------------------------------------------------------------------------------
# Columns, texts and labels
# ---------------------------------------------------------------------------------------------


def check_columns(dataset, split: str, columns: Sequence[str | None]) -> None:
    """Raise `DataError` naming the columns present when a requested one is missing."""
    present = list(dataset.column_names)
    for column in columns:
        if column is not None and column not in present:
            raise DataError(
                f"the {split} data has no column {column!r}; its columns are: "
                f"{', '.join(map(repr, present)) or '(none)'}. Pass text_column=..., "
                "label_column=... (or text_pair_column=...) with the names of yours."
            )


def column_values(dataset, column: str) -> list:
    """All values of a column as a Python list (respects `select`/`shuffle` index maps)."""
    values = dataset[column]
    if not isinstance(values, list) and hasattr(values, "__getitem__"):
        # A `datasets` Column iterated formats one row at a time; sliced, the whole column
        # is formatted at once (about 6x faster: a whole run's preparation waits for it).
        values = values[:]
    return list(values)


def check_texts(values: list, column: str, split: str) -> list[str]:
    """Every value must be a string; say which row is not and how to convert."""
    for row, value in enumerate(values):
        if not isinstance(value, str):
            if value is None:
                raise DataError(
                    f"row {row} of column {column!r} ({split}) is empty (None). Drop such rows "
                    f"first: dataset.filter(lambda row: row[{column!r}] is not None)."
                )
            raise DataError(
                f"column {column!r} ({split}) must hold text, but row {row} holds a "
                f"{type(value).__name__} ({short(value)}). Convert it first, e.g. "
                f"dataset.map(lambda row: {{{column!r}: str(row[{column!r}])}}), or pick the "
                "right text_column."
            )
    return values


def short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def value_kind(value: Any) -> str:
    if isinstance(value, (bool, np.bool_)):
        return "int"
    if isinstance(value, (int, np.integer)):
        return "int"
    if isinstance(value, (float, np.floating)):
        return "float"
    if isinstance(value, str):
        return "str"
    return type(value).__name__


def class_label_names(dataset, column: str) -> list[str] | None:
    """The names of a `ClassLabel` column, or None for any other type."""
    feature = dataset.features.get(column) if hasattr(dataset, "features") else None
    names = getattr(feature, "names", None)
    return list(names) if names else None


def meaningful_label_names(id2label: Mapping | None) -> list[str] | None:
    """A model config's label names, unless they are transformers' defaults (LABEL_0, ...)."""
    if not id2label:
        return None
    names = [str(id2label[key]) for key in sorted(id2label, key=int)]
    if all(name == f"LABEL_{i}" for i, name in enumerate(names)):
        return None
    return names


def map_labels(
    splits: Mapping[str, list],
    *,
    column: str,
    dataset_names: Mapping[str, list[str] | None] | None = None,
    model_names: list[str] | None = None,
    model_num_labels: int | None = None,
) -> tuple[list[str], dict[str, np.ndarray]]:
    """Check labels and turn them into class ids.

    Args:
        splits: split name -> raw label values; the first split decides the classes.
        column: the label column's name, for messages.
        dataset_names: split name -> `ClassLabel` names of that split (or None).
        model_names: the label names the model already has (a fine-tuned head), if any.
        model_num_labels: the head size when it cannot change (a model instance was passed).

    Returns:
        `(label_names, {split: int64 ids})`.
    """
    kind = _label_kind(splits, column)
    if kind == "str":
        names, ids = _ids_of_names(splits, model_names)
    else:
        names, ids = _checked_ids(splits, column, dataset_names or {}, model_names)
    if model_num_labels is not None and len(names) > model_num_labels:
        raise DataError(
            f"the labels need {len(names)} classes, but the model's classification head has "
            f"{model_num_labels} outputs (labels out of range). Create the model with "
            f"num_labels={len(names)}, or pass the model's name or folder so fine_tune can "
            "size the head."
        )
    if model_num_labels is not None and len(names) < model_num_labels:
        names = names + [f"LABEL_{i}" for i in range(len(names), model_num_labels)]
    return names, ids


def _label_kind(splits: Mapping[str, list], column: str) -> str:
    """The one kind of every label ("str" or "int"); refused when a label is missing, when
    kinds are mixed, or for floats and other values."""
    kinds: dict[str, tuple[int, str]] = {}
    for split, values in splits.items():
        if not values:
            raise DataError(f"the {split} data is empty: it needs at least one row.")
        for row, value in enumerate(values):
            if value is None:
                raise DataError(
                    f"row {row} of label column {column!r} ({split}) is empty (None). Every "
                    "row needs a label; drop unlabeled rows with dataset.filter(...)."
                )
            kinds.setdefault(value_kind(value), (row, split))
    if len(kinds) > 1:
        examples = ", ".join(
            f"{kind} (row {row} of {split}: {short(splits[split][row])})"
            for kind, (row, split) in kinds.items()
        )
        raise DataError(
            f"label column {column!r} mixes types: {examples}. Use either class names "
            "(strings) or class ids (integers 0..N-1) throughout."
        )
    kind = next(iter(kinds))
    if kind == "float":
        first = splits[next(iter(splits))]
        raise DataError(
            f"label column {column!r} holds floats (e.g. {short(first[0])}): fine_tune "
            "trains classifiers. Map the values to class ids (0..N-1) or class names first."
        )
    if kind not in ("int", "str"):
        row, split = kinds[kind]
        raise DataError(
            f"label column {column!r} holds {kind} values (row {row} of {split}: "
            f"{short(splits[split][row])}); labels must be class names (str) or ids (int)."
        )
    return kind


def _ids_of_names(splits: Mapping[str, list], model_names: list[str] | None
                  ) -> tuple[list[str], dict[str, np.ndarray]]:
    """Class names as ids: the model's names when they hold every label, else the training
    split's names, sorted; refused for a label the training split does not have."""
    all_values = {value for values in splits.values() for value in values}
    if model_names and all_values <= set(model_names):
        names = list(model_names)
    else:
        names = sorted(set(splits[next(iter(splits))]))
    index = {name: i for i, name in enumerate(names)}
    ids: dict[str, np.ndarray] = {}
    for split, values in splits.items():
        unknown = sorted({value for value in values if value not in index})
        if unknown:
            raise DataError(
                f"the {split} data has labels the training data does not have: "
                f"{', '.join(map(repr, unknown[:5]))}. Every class must appear in the "
                f"training data (classes: {', '.join(map(repr, names[:10]))})."
            )
        ids[split] = np.fromiter((index[value] for value in values), np.int64, len(values))
    return names, ids


def _checked_ids(splits: Mapping[str, list], column: str,
                 dataset_names: Mapping[str, list[str] | None], model_names: list[str] | None
                 ) -> tuple[list[str], dict[str, np.ndarray]]:
    """Class ids checked against the `ClassLabel` names (if any), and the class names: the
    dataset's, else the model's when they cover every id, else LABEL_0..."""
    names = next((n for n in dataset_names.values() if n), None)
    highest = max(int(max(values)) for values in splits.values())
    ids: dict[str, np.ndarray] = {}
    for split, values in splits.items():
        array = np.asarray(values, dtype=np.int64)
        low = int(array.min())
        limit = len(names) if names else None
        if low < 0 or (limit is not None and int(array.max()) >= limit):
            bad = int(array[array < 0][0]) if low < 0 else int(array.max())
            allowed = f"0..{limit - 1}" if limit else "0 or more"
            raise DataError(
                f"label {bad} in column {column!r} ({split}) is out of range: class ids "
                f"must be {allowed}. Remove or fix those rows (a ClassLabel uses -1 for "
                "a missing label)."
            )
        ids[split] = array
    if names is None:
        if model_names and len(model_names) > highest:
            names = list(model_names)
        else:
            names = [f"LABEL_{i}" for i in range(highest + 1)]
    return names, ids
