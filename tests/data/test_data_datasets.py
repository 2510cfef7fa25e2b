"""Prompt datasets: JSON lines, Parquet, datasets directories; GSM8K's and verl's layouts through
the reading keys (dotted paths); errors name file, row and key."""

from __future__ import annotations

import json

import pytest

from glassrl.data.datasets import MissingField, load_prompts, lookup
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


def test_an_answer_key_no_row_has_is_an_error_naming_file_and_key(tmp_path):
    # issue 31, item 12: a wrong data.answer_key trained on "0 with an answer", task/accuracy NaN
    rows = [{"question": "2+2=", "solution": "4"}, {"question": "1+1=", "solution": "2"}]
    path = write_jsonl(tmp_path / "gsm.jsonl", rows)
    with pytest.raises(GlassrlError) as info:
        load_prompts(path, prompt_key="question", answer_key="answr")
    assert str(info.value) == (
        f"{path}: answer_key = 'answr': no row has this field (fields of the first row: question, solution)"
    )
    partly = write_jsonl(tmp_path / "partly.jsonl", [{"question": "a"}, {"question": "b", "solution": "2"}])
    assert [r.answer for r in load_prompts(partly, prompt_key="question", answer_key="solution")] == [None, "2"]


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


# GSM8K's own JSON lines (openai/grade-school-math, train.jsonl): question, and a worked answer ending "#### N".
GSM8K = [
    {
        "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips "
        "in May. How many clips did Natalia sell altogether in April and May?",
        "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips "
        "altogether in April and May.\n#### 72",
    },
    {
        "question": "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. "
        "How much did she earn?",
        "answer": "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\nWorking 50 minutes, she earned "
        "0.2 x 50 = $<<0.2*50=10>>10.\n#### 10",
    },
]


def verl_rows(questions=GSM8K):
    """Rows as verl's examples/data_preprocess/gsm8k.py writes them to Parquet."""
    return [
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": q["question"] + " Let's think step by step."}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": q["answer"].split("#### ")[-1]},
            "extra_info": {"split": "train", "index": i, "answer": q["answer"], "question": q["question"]},
        }
        for i, q in enumerate(questions)
    ]


def test_gsm8k_file_reads_with_its_own_column_names(tmp_path):
    path = write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K)
    with pytest.raises(GlassrlError, match=rf"^{path}:1: missing field 'prompt' \(fields: question, answer\)$"):
        load_prompts(path)  # the defaults name the columns prompt/answer
    records = load_prompts(path, prompt_key="question")
    assert [r.prompt for r in records] == [q["question"] for q in GSM8K]
    assert records[0].answer.endswith("#### 72") and records[1].answer.endswith("#### 10")
    assert records[0].metadata == {} and records[1].source == f"{path}:2"


def test_verl_parquet_reads_nested_fields(tmp_path):
    rows = verl_rows()
    path = write_parquet(tmp_path / "train.parquet", rows)
    records = load_prompts(path, answer_key="reward_model.ground_truth")
    assert [r.answer for r in records] == ["72", "10"]
    assert records[0].prompt == ({"role": "user", "content": rows[0]["prompt"][0]["content"]},)
    # by default every other top-level field is metadata, nested objects whole (verl's compute_score reads
    # data_source and extra_info)
    assert set(records[0].metadata) == {"data_source", "ability", "reward_model", "extra_info"}
    assert records[1].metadata["extra_info"]["index"] == 1
    chosen = load_prompts(
        path, answer_key="reward_model.ground_truth", metadata_keys=["data_source", "extra_info.index"]
    )
    assert [r.metadata for r in chosen] == [
        {"data_source": "openai/gsm8k", "extra_info.index": 0},
        {"data_source": "openai/gsm8k", "extra_info.index": 1},
    ]


@pytest.mark.parametrize(
    "keys, message",
    [
        (
            dict(prompt_key="extra_info.question"),
            "2: missing field 'extra_info.question' (fields of 'extra_info': split)",
        ),
        (
            dict(metadata_keys=["reward_model.style"]),
            "2: missing field 'reward_model.style' (fields of 'reward_model': ",
        ),
        (dict(metadata_keys=["data_source.name"]), "1: missing field 'data_source.name' ('data_source' is a str, not"),
        (dict(metadata_keys=["extra"]), "1: missing field 'extra' (fields: data_source, prompt, ability, reward_model"),
    ],
)
def test_a_missing_nested_field_names_file_row_key_and_what_is_there(tmp_path, keys, message):
    rows = verl_rows()
    rows[1] = {**rows[1], "reward_model": {"ground_truth": "10"}, "extra_info": {"split": "train"}}
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    with pytest.raises(GlassrlError) as info:
        load_prompts(path, **keys)
    assert str(info.value).startswith(f"{path}:{message}")


def test_parquet_missing_field_names_the_row_index(tmp_path):
    path = write_parquet(tmp_path / "train.parquet", verl_rows())
    with pytest.raises(
        GlassrlError, match=rf"^{path}#0: missing field 'reward_model.score' \(fields of 'reward_model'"
    ):
        load_prompts(path, metadata_keys=["reward_model.score"])


def test_lookup_prefers_a_literal_dotted_name():
    row = {"a.b": 1, "a": {"b": 2, "c": {"d": 3}}}
    assert lookup(row, "a.b") == 1 and lookup(row, "a.c.d") == 3 and lookup(row, "a") == row["a"]
    with pytest.raises(MissingField, match=r"fields of 'a\.c': d"):
        lookup(row, "a.c.e")
    with pytest.raises(MissingField, match=r"^fields: a\.b, a$"):
        lookup(row, "x")
