"""Prompt datasets: JSON lines, Parquet, datasets directories; errors name file and row; filtering."""

from __future__ import annotations

import json
import logging

import pytest

from glassrl.data.datasets import load_prompts, prompt_token_count
from glassrl.data.records import PromptRecord
from glassrl.errors import GlassrlError

CHAT = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "请问1+1=2？"}]
ROWS = [
    {"prompt": "请问1+1=2？", "answer": "是的，等于2！", "a": 1, "b": 1, "sum": 2, "is_true": True, "lang": "zh"},
    {"prompt": CHAT, "answer": "是的，等于2！", "a": 1, "b": 1, "sum": 2, "is_true": True, "lang": "zh"},
    {"prompt": "3+4=", "answer": 7, "a": 3, "b": 4, "sum": 7, "is_true": False, "lang": "en"},
]


def write_jsonl(path, rows, blank_after_first=False):
    lines = [json.dumps(r, ensure_ascii=False) for r in rows]
    if blank_after_first:
        lines.insert(1, "")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_parquet(path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def normalised(rows):
    """ROWS with every prompt in the same form (parquet needs one type per column)."""
    out = []
    for r in rows:
        prompt = CHAT if r is ROWS[1] else [{"role": "user", "content": r["prompt"]}]
        out.append({**r, "prompt": prompt, "answer": str(r["answer"])})
    return out


def check_records(records, rows):
    assert len(records) == len(rows)
    for record, row in zip(records, rows):
        assert isinstance(record, PromptRecord)
        prompt = row["prompt"] if isinstance(row["prompt"], str) else tuple(row["prompt"])
        assert record.prompt == prompt
        assert record.answer == str(row["answer"])
        assert record.metadata == {k: v for k, v in row.items() if k not in ("prompt", "answer")}


def test_jsonl_round_trip_with_line_numbers(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", ROWS, blank_after_first=True)
    records = load_prompts(path)
    check_records(records, ROWS)
    assert records[1].prompt == tuple(CHAT)
    assert records[2].answer == "7" and records[2].metadata["sum"] == 7
    assert [r.source for r in records] == [f"{path}:1", f"{path}:3", f"{path}:4"]  # the blank line 2 is skipped


def test_custom_keys(tmp_path):
    path = write_jsonl(tmp_path / "q.json", [{"question": "2+2=", "label": "4", "id": 9}])
    (record,) = load_prompts(path, prompt_key="question", answer_key="label")
    assert (record.prompt, record.answer, record.metadata) == ("2+2=", "4", {"id": 9})


def test_missing_answer_is_none(tmp_path):
    (record,) = load_prompts(write_jsonl(tmp_path / "q.jsonl", [{"prompt": "hi"}]))
    assert record.answer is None and record.metadata == {}


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"prompt": "x", ', "not valid JSON"),
        ('["prompt"]', "expected a JSON object, got list"),
        ('{"question": "x"}', "missing field 'prompt' (fields: question)"),
        ('{"prompt": ""}', "field 'prompt': the prompt is empty"),
        ('{"prompt": 3}', "field 'prompt': expected a string or a non-empty list of messages"),
        ('{"prompt": []}', "field 'prompt': expected a string or a non-empty list of messages"),
        (
            '{"prompt": [{"role": "user", "content": "a"}, {"role": "user"}]}',
            "field 'prompt': message 2 has no 'content'",
        ),
        ('{"prompt": [{"content": "a"}]}', "field 'prompt': message 1 has no 'role'"),
        (
            '{"prompt": [{"role": "robot", "content": "a"}]}',
            "message 1 has role 'robot'; valid: system, user, assistant, tool",
        ),
        ('{"prompt": [{"role": "user", "content": 5}]}', "message 1: 'content' must be a string, got int"),
        ('{"prompt": ["hi"]}', "message 1 is not an object"),
        ('{"prompt": "x", "answer": {"a": 1}}', "field 'answer' must be a string or a number, got dict"),
    ],
)
def test_malformed_jsonl_rows_name_file_and_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "fine"}\n\n' + line + "\n", encoding="utf-8")
    with pytest.raises(GlassrlError) as info:
        load_prompts(path)
    assert str(info.value).startswith(f"{path}:3: ")
    assert message in str(info.value)


def test_parquet_round_trip(tmp_path):
    rows = normalised(ROWS)
    path = write_parquet(tmp_path / "train.parquet", rows)
    records = load_prompts(path)
    check_records(records, rows)
    assert [r.source for r in records] == [f"{path}#0", f"{path}#1", f"{path}#2"]


def test_parquet_malformed_row_names_the_row(tmp_path):
    rows = [{"prompt": [{"role": "user", "content": "a"}]}, {"prompt": [{"role": "user", "content": None}]}]
    path = write_parquet(tmp_path / "bad.parquet", rows)
    with pytest.raises(GlassrlError, match=rf"^{path}#1: field 'prompt': message 1 has no 'content'$"):
        load_prompts(path)


def test_datasets_directory_round_trip_and_splits(tmp_path):
    import datasets

    rows = normalised(ROWS)
    single = tmp_path / "single"
    datasets.Dataset.from_list(rows).save_to_disk(str(single))
    records = load_prompts(single)
    check_records(records, rows)
    assert records[2].source == f"{single}#2"

    both = tmp_path / "both"
    splits = {"train": datasets.Dataset.from_list(rows[:2]), "test": datasets.Dataset.from_list(rows[2:])}
    datasets.DatasetDict(splits).save_to_disk(str(both))
    test = load_prompts(f"{both}::test")
    check_records(test, rows[2:])
    assert test[0].source == f"{both}::test#0"
    with pytest.raises(GlassrlError, match="several splits; pick one with PATH::SPLIT; splits: train, test"):
        load_prompts(both)
    with pytest.raises(GlassrlError, match="split 'dev' not found; splits: train, test"):
        load_prompts(f"{both}::dev")
    with pytest.raises(GlassrlError, match="without splits"):
        load_prompts(f"{single}::train")


@pytest.mark.parametrize("name, message", [("data.csv", "unknown format '.csv'"), ("missing.jsonl", "no such file")])
def test_bad_paths(tmp_path, name, message):
    if name.endswith(".csv"):
        (tmp_path / name).write_text("prompt\nx\n")
    with pytest.raises(GlassrlError, match=message):
        load_prompts(tmp_path / name)


def test_empty_file_is_an_error(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    with pytest.raises(GlassrlError, match="no prompts"):
        load_prompts(path)


@pytest.fixture(scope="module")
def tokenizer():
    from glassrl.models.default_tokenizer import build_tokenizer

    return build_tokenizer(["请问1+1=2？是的，等于2！", "Is 3+4=8? No, it equals 7!"] * 5)


def test_overlong_prompts_are_filtered_and_counted(tmp_path, tokenizer, caplog):
    prompts = ["1+1=", "请问1+1=2？", "Is 3+4=8? " * 6, "Is 3+4=8? " * 9, CHAT]
    lengths = [prompt_token_count(p if isinstance(p, str) else tuple(p), tokenizer) for p in prompts]
    # Text gets BOS; messages go through the chat template with the generation prompt.
    assert (
        lengths[0] == len(tokenizer("1+1=")["input_ids"])
        and tokenizer("1+1=")["input_ids"][0] == tokenizer.bos_token_id
    )
    chat_text = tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert lengths[4] == len(tokenizer(chat_text, add_special_tokens=False)["input_ids"])
    limit = sorted(lengths)[2]  # keeps exactly the three shortest
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": p} for p in prompts])
    with caplog.at_level(logging.INFO, logger="glassrl.data.datasets"):
        kept = load_prompts(path, tokenizer=tokenizer, max_prompt_tokens=limit)
    assert [r.source for r in kept] == [f"{path}:{i + 1}" for i, n in enumerate(lengths) if n <= limit]
    assert len(kept) == 3
    assert f"filtered 2 of 5 prompts longer than {limit} tokens" in caplog.text


def test_all_filtered_or_no_tokenizer_is_an_error(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "Is 3+4=8?"}])
    with pytest.raises(GlassrlError, match="all 1 prompts are longer than max_prompt_tokens=2"):
        load_prompts(path, tokenizer=tokenizer, max_prompt_tokens=2)
    with pytest.raises(GlassrlError, match="needs a tokenizer"):
        load_prompts(path, max_prompt_tokens=2)
