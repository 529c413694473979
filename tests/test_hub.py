"""fine_tune(..., push_to_hub=True) and FineTuneResult.push_to_hub against a stand-in of the
Hub's HTTP API on 127.0.0.1 (`tests/hub_standin.py`): the files uploaded (names and bytes;
no checkpoint), the model card's metadata, the upload made by the kernel after the launch,
the token never printed; refusals before anything is forked or written (no token, an
unreachable Hub, a token refused or read-only, offline mode); a push that fails after
training keeps the result and says how to try again.

One fine-tune launch in all; nothing touches the network.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
from pathlib import Path

import pytest

import hfxla_nb
from hfxla_nb import demo
from hfxla_nb.runtime import detect_accelerator
from hfxla_nb.train import FineTuneConfig, FineTuneError
from hfxla_nb.train.hub import (
    HubError,
    hub_name,
    hub_target,
    model_card,
    provenance,
    push_after_training,
    uploaded_files,
)
from tests.helpers import refuse_launches
from tests.hub_standin import HubStandIn, card_metadata, closed_port_url, hub_at

TOKEN = "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42"
REPO = "tester/tiny-bert-hub"
ROWS = 200  # 160 training rows, 20 validation


@pytest.fixture(scope="module")
def standin():
    hub = HubStandIn(TOKEN).start()
    yield hub
    hub.stop()


@pytest.fixture(scope="module")
def pushed(standin, model_dir, tmp_path_factory):
    """One short fine-tune pushed to the stand-in (a checkpoint at step 2 stays local), with
    everything it printed."""
    out = tmp_path_factory.mktemp("hub") / "tiny-bert"
    printed = io.StringIO()
    with hub_at(standin.url, TOKEN), contextlib.redirect_stdout(printed), \
            contextlib.redirect_stderr(printed):
        result = hfxla_nb.fine_tune(
            model_dir, demo.demo_dataset(n=ROWS), max_steps=3, save_steps=2, batch_size=16,
            learning_rate=1e-3, num_processes=1, progress="console", output_dir=out,
            push_to_hub=True, hub_model_id="tiny-bert-hub", hub_private_repo=True)
    return result, printed.getvalue()


@pytest.mark.launch
def test_the_push_uploads_the_saved_folder_from_the_kernel(pushed, standin):
    result, _ = pushed
    repo = standin.repos[REPO]
    assert result.hub_url == f"{standin.url}/{REPO}" and repo.private is True
    assert f"pushed to the Hub: {result.hub_url}" in result.notes
    out = Path(result.output_dir)
    assert (out / "checkpoints" / "checkpoint-2").is_dir()  # kept local, not uploaded
    local = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*")
             if p.is_file() and "checkpoints" not in p.parts}
    assert set(local) == {"config.json", "model.safetensors", "tokenizer.json",
                          "tokenizer_config.json", "hfxla_nb_run.json"}
    assert set(uploaded_files(out)) == set(local)
    assert {name: data for name, data in repo.files.items() if name != "README.md"} == local
    assert repo.commits == ["hfxla_nb fine_tune: classification, 3 steps"]
    assert not (out / "README.md").exists()  # the card went up, nothing was written here
    # Every request came from this process (the kernel), none from a forked worker.
    assert standin.requests and all(r.from_this_process for r in standin.requests)
    paths = [r.path for r in standin.requests]
    assert paths.index("/api/whoami-v2") < paths.index("/api/repos/create")


@pytest.mark.launch
def test_the_model_card_says_what_was_trained_on_what_and_how(pushed, standin):
    result, _ = pushed
    card = card_metadata(standin.repos[REPO].files["README.md"])
    assert card["library_name"] == "transformers"
    assert card["pipeline_tag"] == "text-classification"
    assert {"hfxla_nb", "classification"} <= set(card["tags"])
    assert "base_model" not in card and "datasets" not in card  # local model, local data
    ours = card["hfxla_nb"]
    assert ours["version"] == hfxla_nb.__version__ and ours["task"] == "classification"
    assert ours["hardware"] == detect_accelerator().description
    assert (ours["devices"], ours["strategy"], ours["precision"]) == (1, "spmd", "fp32")
    assert ours["graphs_compiled"] == {"training": 1, "evaluation": 1,
                                       "setup": result.setup_compiles}
    assert (result.compiles, result.eval_compiles) == (1, 1)
    assert ours["data"] == {"name": None, "columns": ["text", "label"],
                            "rows": {"train": 160, "validation": 20}}
    training = ours["training"]
    assert (training["learning_rate"], training["batch_size"], training["max_steps"],
            training["steps"], training["seed"]) == (1e-3, 16, 3, 3, 0)
    assert ours["metrics"] == result.metrics
    # The scores (not the counts) as the Hub's model-index.
    [entry] = card["model-index"]
    [results] = entry["results"]
    assert results["task"] == {"type": "text-classification"}
    assert results["dataset"] == {"name": "local data (160 training rows)", "type": "local"}
    assert {m["type"]: m["value"] for m in results["metrics"]} == {
        "accuracy": result.metrics["eval_accuracy"], "loss": result.metrics["eval_loss"]}
    # A Hub model on a Hub dataset: named as the Hub's metadata names them.
    named = dataclasses.replace(result, provenance={
        **result.provenance, "base_model": "google-bert/bert-base-cased", "dataset": "imdb"})
    data = card_metadata(model_card(named, REPO))
    assert data["base_model"] == "google-bert/bert-base-cased" and data["datasets"] == ["imdb"]
    assert data["model-index"][0]["results"][0]["dataset"] == {"name": "imdb", "type": "imdb"}


def test_provenance_names_only_what_is_on_the_hub(model_dir, tmp_path):
    assert hub_name("bert-base-cased") == "bert-base-cased" and hub_name("org/name")
    for local in (model_dir, "./x", "/abs/x", "~/x", "a/b/c", 3):
        assert hub_name(local) is None, local
    facts = provenance("org/model", "stanfordnlp/imdb", FineTuneConfig(), ["text"],
                       {"train": 4}, "XLA:CPU")
    assert (facts["base_model"], facts["dataset"]) == ("org/model", "stanfordnlp/imdb")
    json.dumps(facts)  # plain data: it rides in the run summary


@pytest.mark.launch
def test_the_token_is_never_printed(pushed, standin):
    result, printed = pushed
    assert TOKEN not in printed
    assert TOKEN not in repr(result) and TOKEN not in json.dumps(result.to_dict(), default=str)
    for name, data in standin.repos[REPO].files.items():
        assert TOKEN.encode() not in data, name
    # ... yet it was what every request of the push was authorized with.
    assert {r.authorization for r in standin.requests if r.path != "/api/agent-harnesses"} \
        == {f"Bearer {TOKEN}"}


@pytest.mark.launch
def test_a_push_that_fails_after_training_keeps_the_result_and_says_how_to_retry(
        pushed, standin, capsys):
    result, _ = pushed
    copy = dataclasses.replace(result, hub_url=None, notes=list(result.notes))
    with hub_at(standin.url, TOKEN):
        target = hub_target("retry", None, "unused")
        standin.fail_commits = True
        try:
            push_after_training(copy, target)  # what fine_tune does after the launch
            with pytest.raises(HubError, match="could not push .*HfHubHTTPError.*500"):
                copy.push_to_hub("retry")  # asked for explicitly: raised
        finally:
            standin.fail_commits = False
        said = capsys.readouterr().out
        assert "the model was not pushed to the Hub" in said
        assert "result.push_to_hub('tester/retry') tries again" in said
        assert copy.notes[0] == said.strip() and copy.hub_url is None
        assert TOKEN not in said
        assert copy.push_to_hub("retry") == f"{standin.url}/tester/retry"
    assert set(standin.repos["tester/retry"].files) == set(standin.repos[REPO].files)


HF = "push_to_hub=True: "
REFUSALS = {
    # case: (endpoint, token, offline, words of the message)
    "no token": ("standin", None, False, ["needs a Hugging Face token", "hf auth login",
                                          "huggingface-cli login", "HF_TOKEN"]),
    "unreachable": ("closed", TOKEN, False, ["cannot be reached", "HF_ENDPOINT",
                                             "result.push_to_hub"]),
    "refused token": ("standin", "hf_notTheRightOne", False, ["refused the token (401",
                                                              "hf auth login"]),
    "offline": ("standin", TOKEN, True, ["HF_HUB_OFFLINE is set"]),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_the_hub_is_checked_before_anything_is_forked_or_written(
        case, standin, model_dir, tmp_path, monkeypatch):
    refuse_launches(monkeypatch)
    where, token, offline, words = REFUSALS[case]
    url = standin.url if where == "standin" else closed_port_url()
    out = tmp_path / "out"
    before = len(standin.requests)
    with hub_at(url, token, offline), pytest.raises(FineTuneError) as error:
        hfxla_nb.fine_tune(model_dir, demo.demo_dataset(n=40), max_steps=1, batch_size=8,
                           progress=False, output_dir=out, push_to_hub=True)
    message = str(error.value)
    assert message.startswith(HF) and all(word in message for word in words), message
    assert TOKEN not in message
    assert not out.exists()
    if case in ("no token", "offline"):  # refused without asking the Hub
        assert len(standin.requests) == before


@pytest.mark.launch
def test_a_result_without_a_saved_folder_says_why_there_is_nothing_to_push(pushed, standin,
                                                                          tmp_path):
    result, _ = pushed
    with hub_at(standin.url, TOKEN):
        for output_dir, why in ((None, "saved no model"), (tmp_path / "gone", "not on this")):
            unsaved = dataclasses.replace(result, output_dir=output_dir and str(output_dir))
            with pytest.raises(HubError, match=f"nothing to push: .*{why}"):
                unsaved.push_to_hub("unsaved")
    assert "tester/unsaved" not in standin.repos


def test_a_read_only_token_is_refused(model_dir, tmp_path):
    reader = HubStandIn(TOKEN, role="read").start()
    try:
        with hub_at(reader.url, TOKEN), pytest.raises(HubError, match="can only read"):
            hub_target(None, None, "x")
    finally:
        reader.stop()


@pytest.mark.parametrize("options, words", [
    ({"hub_model_id": "me/model"}, "add push_to_hub=True"),
    ({"hub_private_repo": True}, "add push_to_hub=True"),
    ({"push_to_hub": "yes"}, "push_to_hub must be True or False"),
    ({"push_to_hub": True, "output_dir": None}, "output_dir=None saves none"),
    ({"push_to_hub": True, "hub_model_id": 3}, "hub_model_id must be a repository id"),
])
def test_hub_options_are_checked_with_the_config(options, words):
    with pytest.raises(FineTuneError, match=words):
        FineTuneConfig(**options)


def test_a_repository_id_the_hub_would_refuse_is_refused(standin):
    with hub_at(standin.url, TOKEN), pytest.raises(HubError, match="not a valid repository"):
        hub_target("bad name!", None, "x")
