"""Training data and configuration: malformed lines are refused with their line numbers,
and tokenization through llama.cpp masks exactly the tokens that should not be trained."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.catalog import profiles
from engine.errors import UsageError
from engine.formats.artifacts import BaseModelInfo
from engine.training import data as data_mod
from engine.training.config import TrainConfig
from engine.training.tokenizer import Tokenizer


def write_lines(path: Path, lines: list[object]) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n"
                            for x in lines))
    return path


@pytest.fixture(scope="module")
def tokenizer(embedded_path: Path, base_info: BaseModelInfo):
    with Tokenizer(embedded_path, base_info) as tok:
        yield tok


def test_malformed_lines_are_reported_with_line_numbers(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "bad.jsonl", [
        {"text": "fine"},
        "{not json",
        "[1, 2]",
        {"prompt": "p", "complettion": "typo"},
        {"text": 3},
        {"messages": [{"role": "user", "content": "hi"}]},
        {"text": "x", "weight": "heavy"},
        "",
        {"messages": [{"role": "wizard", "content": "hi"},
                      {"role": "assistant", "content": "yo"}]},
        {"prompt": "p", "chosen": "a", "rejected": "b"},
        {"text": "   "},
    ])
    with pytest.raises(data_mod.DataError) as caught:
        data_mod.read_records(path, dpo=False)
    message = caught.value.message
    assert message.startswith("bad.jsonl: 9 malformed lines")
    expected = {
        2: "not valid JSON", 3: "expected a JSON object, got list",
        4: "found complettion, prompt", 5: "text must be a string",
        6: "no assistant turn", 7: "weight must be a finite number",
        9: "unknown role 'wizard'", 10: "train it with --dpo", 11: "text is empty",
    }
    details = {int(d.split(":")[0].removeprefix("line ")): d for d in caught.value.details}
    assert set(details) == set(expected)
    for line, reason in expected.items():
        assert reason in details[line], details[line]


def test_preference_lines_need_dpo_and_dpo_needs_them(tmp_path: Path) -> None:
    pairs = write_lines(tmp_path / "p.jsonl", [
        {"prompt": "Q", "chosen": "good", "rejected": "bad"},
        {"messages": [{"role": "user", "content": "Q"}], "chosen": "A", "rejected": "B",
         "weight": -0.5},
    ])
    records, sha = data_mod.read_records(pairs, dpo=True)
    assert [r.kind for r in records] == ["preference", "preference"]
    assert records[1].weight == -0.5 and len(sha) == 64
    plain = write_lines(tmp_path / "t.jsonl", [{"text": "hello"}])
    with pytest.raises(data_mod.DataError, match="line 1: --dpo needs preference lines"):
        data_mod.read_records(plain, dpo=True)
    same = write_lines(tmp_path / "s.jsonl", [{"prompt": "Q", "chosen": "A", "rejected": "A"}])
    with pytest.raises(data_mod.DataError, match="line 1: chosen and rejected are the same"):
        data_mod.read_records(same, dpo=True)


def test_empty_file_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "e.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(data_mod.DataError, match="no examples"):
        data_mod.read_records(empty, dpo=False)


def trained_text(tok: Tokenizer, seq: data_mod.Sequence) -> str:
    return tok.detokenize([t for t, m in zip(seq.tokens, seq.targets, strict=True) if m])


def test_masks_follow_the_format(tmp_path: Path, tokenizer: Tokenizer) -> None:
    path = write_lines(tmp_path / "d.jsonl", [
        {"prompt": "The capital of France is", "completion": " Paris."},
        {"messages": [{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": "Colour of grass?"},
                      {"role": "assistant", "content": "Green."},
                      {"role": "user", "content": "And the sky?"},
                      {"role": "assistant", "content": "Blue."}]},
        {"text": "One two three four."},
    ])
    for eot in (False, True):
        ds = data_mod.load(path, tokenizer, 256, eot, False, steps=10, batch=2)
        pair, chat, text = (e.sequences[0] for e in ds.examples)
        assert trained_text(tokenizer, pair) == " Paris." + ("<|im_end|>" if eot else "")
        expected = ["Green.", "Blue."]
        if eot:
            expected = [x + "<|im_end|>" for x in expected]
        assert trained_text(tokenizer, chat) == "".join(expected)
        # The prompt part is exactly what serving feeds llama.cpp for this conversation.
        first = chat.targets.index(True)
        rendered = tokenizer.render(
            [data_mod.Message("system", "Be brief."),
             data_mod.Message("user", "Colour of grass?")], add_generation_prompt=True)
        assert list(chat.tokens[:first]) == tokenizer.prompt_tokens(rendered)
        assert not text.targets[0] and all(text.targets[1:])
        assert ds.kinds == ("chat", "pair", "text")
    assert ds.system_prompt is None  # not every example shares one system message


def test_a_shared_system_prompt_is_kept_in_the_summary_the_provenance_records(
        tmp_path: Path, tokenizer: Tokenizer) -> None:
    """The run's provenance keeps it (its data summary), and the composer offers it to a
    new variant of the adapter (`profiles.trained_system_prompt`)."""
    system = {"role": "system", "content": "Answer in French."}
    path = write_lines(tmp_path / "d.jsonl", [
        {"messages": [system, {"role": "user", "content": f"Count to {n}."},
                      {"role": "assistant", "content": "un deux"}]} for n in (2, 3)])
    ds = data_mod.load(path, tokenizer, 256, True, False, steps=10, batch=2)
    assert ds.system_prompt == "Answer in French."
    assert ds.summary()["system_prompt"] == "Answer in French."
    adapter = {"name": "fr", "provenance": {"data": ds.summary()}}
    assert profiles.trained_system_prompt(adapter) == "Answer in French."
    assert profiles.trained_system_prompt({"name": "x", "provenance": {"data": {}}}) is None
    assert profiles.trained_system_prompt({"name": "x"}) is None
    assert "system_prompt" not in write_and_load_plain(tmp_path, tokenizer).summary()


def write_and_load_plain(tmp_path: Path, tokenizer: Tokenizer) -> data_mod.DataSet:
    path = write_lines(tmp_path / "plain.jsonl", [{"text": "One two three four five."}] * 2)
    return data_mod.load(path, tokenizer, 256, True, False, steps=10, batch=2)


def test_truncation_and_small_data_warnings(tmp_path: Path, tokenizer: Tokenizer) -> None:
    long_answer = " ".join(["word"] * 200)
    path = write_lines(tmp_path / "d.jsonl", [
        {"prompt": "Say many words:", "completion": long_answer},
        {"prompt": "Hi", "completion": " there", "weight": -1},
    ])
    ds = data_mod.load(path, tokenizer, 32, False, False, steps=100, batch=4)
    assert len(ds.examples[0].sequences[0].tokens) == 32 and ds.examples[0].truncated
    assert any(w.startswith("small data: 2 examples, each seen about 200.0 times")
               for w in ds.warnings)
    assert any("1 example was truncated to seq-len 32" in w for w in ds.warnings)
    assert any("negative weight" in w for w in ds.warnings)
    only_prompt = write_lines(tmp_path / "p.jsonl", [
        {"prompt": long_answer, "completion": " end"}])
    with pytest.raises(data_mod.DataError, match="line 1: nothing left to train after "
                                                 "truncating to seq-len 32"):
        data_mod.load(only_prompt, tokenizer, 32, False, False, steps=1, batch=1)


def test_large_data_has_no_memorisation_warning(tmp_path: Path, tokenizer: Tokenizer) -> None:
    path = write_lines(tmp_path / "d.jsonl", [{"prompt": f"Item {i}:", "completion": " ok"}
                                              for i in range(64)])
    ds = data_mod.load(path, tokenizer, 64, False, False, steps=10, batch=4)
    assert ds.warnings == ()


def test_preference_pairs_share_their_prompt(tmp_path: Path, tokenizer: Tokenizer) -> None:
    path = write_lines(tmp_path / "p.jsonl", [
        {"messages": [{"role": "user", "content": "Pick a colour."}], "chosen": "Blue.",
         "rejected": "I refuse."}])
    ds = data_mod.load(path, tokenizer, 128, True, True, steps=1, batch=1)
    chosen, rejected = ds.examples[0].sequences
    assert trained_text(tokenizer, chosen) == "Blue.<|im_end|>"
    assert trained_text(tokenizer, rejected) == "I refuse.<|im_end|>"
    first = chosen.targets.index(True)
    assert chosen.tokens[:first] == rejected.tokens[:first]


def test_a_kl_text_is_its_lines_as_served_prose(tmp_path: Path, tokenizer: Tokenizer) -> None:
    """One passage per non-empty line, tokenized without special tokens (as the drift
    check scores prose), cut to seq-len; non-UTF-8 and empty files are refused."""
    path = tmp_path / "kl.txt"
    path.write_text("The river rose slowly.\n\n   \n" + " ".join(["word"] * 60) + "\nHi\n")
    text = data_mod.load_kl_text(path, tokenizer, 16)
    river = tokenizer.tokenize("The river rose slowly.", add_special=False)
    # "Hi" is one token: nothing to predict, so it is no passage.
    assert [len(p) for p in text.passages] == [len(river), 16]
    assert text.passages[0] == tuple(river) and text.truncated == 1
    assert text.summary() == {"file": "kl.txt", "sha256": text.sha256, "passages": 2,
                              "tokens": len(river) + 16, "truncated": 1}
    path.write_bytes(b"fine\n\xff\xfe broken\n")
    with pytest.raises(data_mod.DataError, match="kl.txt: line 2: not valid UTF-8"):
        data_mod.load_kl_text(path, tokenizer, 16)
    path.write_text("\n\n")
    with pytest.raises(data_mod.DataError, match="the KL text is empty"):
        data_mod.load_kl_text(path, tokenizer, 16)


@pytest.mark.parametrize(("settings", "reason"), [
    ({"rank": 0}, "rank must be a whole number"),
    ({"lr": float("nan")}, "learning rate must be a finite number"),
    ({"targets": "q,x"}, "unknown target 'x'"),
    ({"steps": 2.5}, "steps must be a whole number"),
    ({"bogus": 1}, "unknown training settings: bogus"),
    ({"seq_len": 4}, "seq-len must be a whole number from 8"),
    ({"kl": float("nan")}, "kl must be a finite number"),
    ({"kl": -0.5}, "kl must be between 0 and 1000"),
    ({"dpo": True, "kl": 1.0}, "kl is for supervised runs"),
    ({"kl_batch": 0}, "kl-batch must be a whole number from 1"),
])
def test_config_refuses_bad_settings(settings: dict, reason: str) -> None:
    with pytest.raises(UsageError, match=reason):
        TrainConfig.from_dict(settings)


def test_config_schedule_and_round_trip() -> None:
    config = TrainConfig.from_dict({"targets": "v,q", "steps": 20, "lr": 1e-3})
    assert config.targets == ("attn_q", "attn_v")
    assert config.warmup_steps == 2
    rates = [config.lr_at(s) for s in range(20)]
    assert rates[0] < rates[1] < rates[2] == 1e-3 and rates[-1] < rates[2] and rates[-1] > 0
    assert TrainConfig.from_dict(config.to_dict()) == config


def test_numerics_default_to_served_and_old_records_mean_float() -> None:
    from engine.curated.demo import DEMO_SETTINGS
    from engine.training.config import record_settings

    assert record_settings({"rank": 4}) == {"numerics": "float", "kl": 0.0, "kl_batch": 2,
                                            "rank": 4}
    assert TrainConfig().numerics == "served"
    with pytest.raises(UsageError, match="numerics must be one of served, float"):
        TrainConfig.from_dict({"numerics": "fast"})
    old_record = {k: v for k, v in TrainConfig().to_dict().items() if k != "numerics"}
    assert TrainConfig.from_record(old_record).numerics == "float"
    assert TrainConfig.from_record({**old_record, "numerics": "served"}).numerics == "served"
    # The shipped demo was trained in float: its settings pin it until it is retrained.
    assert TrainConfig.from_dict(DEMO_SETTINGS).numerics == "float"


# ---------------------------------------------------------------------------- token lines


def test_token_lines_are_checked_with_line_numbers(tmp_path: Path) -> None:
    n_vocab = 49152
    path = write_lines(tmp_path / "ids.jsonl", [
        {"tokens": [1, 2, 3], "mask": [0, 1, 1]},
        {"tokens": [1, 2.0]},
        {"tokens": [1, True]},
        {"tokens": [1, 49200]},
        {"tokens": [1, 2], "mask": [0]},
        {"tokens": [1, 2], "mask": [0, 2]},
        {"tokens": [1, 2], "mask": [0, True]},
        {"tokens": [1, 2], "mask": [1, 1]},
        {"tokens": [1, 2], "mask": [0, 0]},
        {"tokens": [1, 2], "text": "x"},
        {"mask": [0, 1]},
        {"tokens": []},
        {"tokens": [5]},
        {"tokens": [-1, 3]},
        {"tokens": [1, 2], "weight": 0.5, "id": "r1", "meta": {"k": 1}, "source": "rollout"},
        {"tokens": "1 2"},
        {"tokens": [1, 2], "mask": [0, 1.0]},
        {"tokens": [7, 8], "mask": "01"},
    ])
    with pytest.raises(data_mod.DataError) as caught:
        data_mod.read_records(path, dpo=False, n_vocab=n_vocab)
    expected = {
        2: "token 2.0 (index 1) is not a whole-number token id",
        3: "token True (index 1) is not a whole-number token id",
        4: "token 49200 (index 1) is outside the base's vocabulary (0..49151)",
        5: "mask has 1 values for 2 tokens",
        6: "mask value 2 (index 1) is not 0 or 1",
        7: "mask value True (index 1) is not 0 or 1",
        8: "mask[0] is 1, but the first token cannot be trained",
        9: "mask trains no token",
        10: "a token line has tokens and optionally mask, nothing else; got text, tokens",
        11: "a token line has tokens and optionally mask, nothing else; got mask",
        12: "tokens must be a non-empty list of token ids",
        13: "a single token has nothing to train",
        14: "token -1 (index 0) is outside the base's vocabulary (0..49151)",
        16: "tokens must be a non-empty list of token ids",
        17: "mask value 1.0 (index 1) is not 0 or 1",
        18: "mask must be a list of 0 and 1, got str",
    }
    details = {int(d.split(":")[0].removeprefix("line ")): d for d in caught.value.details}
    assert set(details) == set(expected)
    for line, reason in expected.items():
        assert details[line].startswith(f"line {line}: {reason}"), details[line]
    assert caught.value.message.startswith(f"ids.jsonl: {len(expected)} malformed lines")
    assert caught.value.message.endswith(f"; and {len(expected) - 8} more")

    good = write_lines(tmp_path / "good.jsonl", [
        {"tokens": [1, 2, 3], "mask": [0, 0, 1]},
        {"tokens": [49151, 0], "weight": -2, "id": "x"}])
    records, _ = data_mod.read_records(good, dpo=False, n_vocab=n_vocab)
    assert [(r.kind, r.tokens, r.mask, r.weight) for r in records] == [
        ("tokens", (1, 2, 3), (False, False, True), 1.0),
        ("tokens", (49151, 0), None, -2.0)]
    # Preference training takes no token lines, and says why.
    with pytest.raises(data_mod.DataError,
                       match="line 1: token lines cannot be trained with --dpo"):
        data_mod.read_records(good, dpo=True, n_vocab=n_vocab)


def test_token_ids_out_of_the_bases_vocabulary_are_reported_with_the_rest(
        tmp_path: Path, tokenizer: Tokenizer) -> None:
    top = tokenizer.n_vocab
    path = write_lines(tmp_path / "ids.jsonl", [
        {"prompt": "p", "complettion": "typo"},
        {"tokens": [1, top], "mask": [0, 1]},
        {"tokens": [1, top - 1], "mask": [0, 1]},
    ])
    with pytest.raises(data_mod.DataError) as caught:
        data_mod.load(path, tokenizer, 64, False, False, steps=1, batch=1)
    # One error for both lines: the vocabulary is checked with the line checks.
    assert [d.split(":")[0] for d in caught.value.details] == ["line 1", "line 2"]
    assert caught.value.details[1] == (f"line 2: token {top} (index 1) is outside the "
                                       f"base's vocabulary (0..{top - 1})")
    # encode checks them too, for records read without the vocabulary size.
    records, _ = data_mod.read_records(write_lines(tmp_path / "one.jsonl", [
        {"tokens": [1, top + 5]}]), dpo=False)
    with pytest.raises(data_mod.DataError, match=f"line 1: token {top + 5} \\(index 1\\) "
                                                 "is outside the base's vocabulary"):
        data_mod.encode(records, tokenizer, 64, False)


def test_token_lines_train_exactly_the_ids_and_mask_given(
        tmp_path: Path, tokenizer: Tokenizer) -> None:
    pair_file = write_lines(tmp_path / "pair.jsonl", [
        {"prompt": "The capital of France is", "completion": " Paris."}])
    pair = data_mod.load(pair_file, tokenizer, 256, True, False, 1, 1).examples[0].sequences[0]
    rollout = {"tokens": list(pair.tokens), "mask": [int(m) for m in pair.targets]}
    path = write_lines(tmp_path / "d.jsonl", [
        {"prompt": "The capital of France is", "completion": " Paris."},
        rollout,
        {"tokens": list(pair.tokens)},
    ])
    for eot in (False, True):
        ds = data_mod.load(path, tokenizer, 256, eot, False, steps=10, batch=2)
        from_pair, from_ids, maskless = (e.sequences[0] for e in ds.examples)
        # The ids go in untouched: no BOS added, no end-of-turn appended with --train-eot.
        assert from_ids == pair
        assert (from_pair == pair) is eot
        assert maskless.tokens == pair.tokens
        assert not maskless.targets[0] and all(maskless.targets[1:])
        assert ds.kinds == ("pair", "tokens")
        assert ds.summary()["kinds"] == ["pair", "tokens"]
        assert ds.summary()["target_tokens"] == (from_pair.n_targets + pair.n_targets
                                                 + len(pair.tokens) - 1)
        eot_warnings = [w for w in ds.warnings if "--train-eot" in w]
        assert eot_warnings == ([
            "--train-eot does not apply to the 2 token lines: their mask says exactly "
            "which ids are trained"] if eot else [])
    assert trained_text(tokenizer, pair) == " Paris.<|im_end|>"


def test_token_lines_are_truncated_like_the_others(tmp_path: Path,
                                                   tokenizer: Tokenizer) -> None:
    ids = list(range(100, 140))
    path = write_lines(tmp_path / "d.jsonl", [
        {"tokens": ids, "mask": [0] * 4 + [1] * 36},
        {"tokens": [7, 8, 9]},
    ])
    ds = data_mod.load(path, tokenizer, 16, False, False, steps=1, batch=1)
    cut, whole = ds.examples
    assert cut.truncated and cut.sequences[0].tokens == tuple(ids[:16])
    assert cut.sequences[0].targets == (False,) * 4 + (True,) * 12
    assert not whole.truncated and whole.sequences[0].targets == (False, True, True)
    assert any("1 example was truncated to seq-len 16" in w for w in ds.warnings)
    late = write_lines(tmp_path / "late.jsonl", [
        {"tokens": ids, "mask": [0] * 30 + [1] * 10}])
    with pytest.raises(data_mod.DataError, match="line 1: nothing left to train after "
                                                 "truncating to seq-len 16 "
                                                 r"\(this line needs 31 or more\)") as info:
        data_mod.load(late, tokenizer, 16, False, False, steps=1, batch=1)
    # The whole message names the seq-len that trains every line; it does.
    assert info.value.message.endswith("(--seq-len 31 or more leaves every line a token "
                                       "to train)")
    assert data_mod.load(late, tokenizer, 31, False, False, steps=1, batch=1).examples
    with pytest.raises(data_mod.DataError, match="--seq-len 31 or more"):
        data_mod.load(late, tokenizer, 30, False, False, steps=1, batch=1)


def test_score_sets_refuse_token_lines(tmp_path: Path) -> None:
    from engine.training import score_sets

    path = write_lines(tmp_path / "s.jsonl", [
        {"text": "fine"}, {"tokens": [1, 2, 3]}, {"prompt": "p", "completion": " c"},
        {"tokens": [4, 5], "mask": [0, 1]}])
    with pytest.raises(data_mod.DataError) as caught:
        score_sets.read_set(path)
    assert caught.value.message.startswith("s.jsonl: 2 lines cannot be scored: line 2: "
                                           "token lines cannot be scored")
    assert [d.split(":")[0] for d in caught.value.details] == ["line 2", "line 4"]
