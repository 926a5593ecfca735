"""Summarisation data: ACLSum (offline default), Reddit TL;DR, the prompt, the SFT/RL split.

An :class:`Example` is one (source text -> gold summary) pair with the instruction that asks
for it. ACLSum (the ``aclsum`` package's JSONL, read directly) gives three pairs per paper:
the abstract summarised for its challenge, approach and outcome. TL;DR comes from a local
JSONL/parquet file or a Hugging Face ``datasets`` id, in any of the common schemas
(:data:`TLDR_SCHEMAS`). The paper's "50-50 split" of examples into an SFT half and an RL half
is :func:`split_examples`, after holding out evaluation prompts whose source texts no SFT or RL
example has (:func:`check_disjoint`).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from haepo_ray.llm.assets import package_dir
from haepo_ray.user_paths import read_text

__all__ = [
    "ACLSUM_ASPECTS",
    "TLDR_SCHEMAS",
    "Example",
    "Splits",
    "check_disjoint",
    "cycle",
    "data_file",
    "drawn",
    "format_prompt",
    "load_aclsum",
    "load_examples",
    "load_tldr",
    "shown_source",
    "split_examples",
]

ACLSUM_ASPECTS: tuple[str, ...] = ("challenge", "approach", "outcome")
TLDR_INSTRUCTION = "Summarize this Reddit post in one sentence (TL;DR)."
# (source key, summary key) of the TL;DR layouts in use: webis/tldr-17 (content, summary),
# the filtered OpenAI TL;DR (post, summary), CarperAI's SFT set (prompt, label), trl-lib's
# (prompt, completion). The first layout whose two keys a row has is used.
TLDR_SCHEMAS: tuple[tuple[str, str], ...] = (
    ("post", "summary"),
    ("content", "summary"),
    ("prompt", "label"),
    ("prompt", "completion"),
)


@dataclass(frozen=True)
class Example:
    """One summarisation task: ``instruction`` applied to ``source``; ``reference`` is gold."""

    prompt_id: str
    instruction: str
    source: str
    reference: str


@dataclass(frozen=True)
class Splits:
    """Disjoint example sets: supervised warm-up, RL prompts, held-out evaluation prompts."""

    sft: tuple[Example, ...]
    rl: tuple[Example, ...]
    eval: tuple[Example, ...]


def _aclsum_dir() -> Path:
    return package_dir("aclsum", "aclsum==0.1.2", "the ACLSum data") / "dataset"


def _text(row: Mapping[str, Any], key: str, where: str) -> str:
    value = row.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}: {key!r} must be a non-empty string, got {value!r:.80}")
    return value.strip()


def load_aclsum(
    splits: Sequence[str] = ("train", "val", "test"), root: str | Path | None = None
) -> list[Example]:
    """ACLSum's abstract -> one-sentence summary pairs, one per paper and aspect."""
    root = Path(root) if root is not None else _aclsum_dir()
    examples = []
    for split in splits:
        path = root / f"{split}.jsonl"
        if not path.is_file():
            raise ValueError(f"ACLSum split {split!r}: no file {path}")
        for where, row in _jsonl_rows(path):
            abstract = row.get("sentences", {}).get("abstract") if isinstance(row, dict) else None
            if not isinstance(abstract, list) or not abstract or not all(isinstance(s, str) for s in abstract):
                raise ValueError(f"{where}: 'sentences.abstract' must be a non-empty list of strings")
            summary = row.get("summary")
            if not isinstance(summary, dict):
                raise ValueError(f"{where}: 'summary' must be an object with keys {ACLSUM_ASPECTS}")
            paper = _text(row, "id", where)
            for aspect in ACLSUM_ASPECTS:
                examples.append(Example(
                    prompt_id=f"aclsum/{paper}/{aspect}",
                    instruction=f"Summarize the {aspect} of this paper abstract in one sentence.",
                    source=" ".join(s.strip() for s in abstract),
                    reference=_text(summary, aspect, f"{where} summary"),
                ))
    return examples


def jsonl_rows(lines: Iterable[str], where: Callable[[int], str]) -> Iterator[tuple[str, Any]]:
    """``(where(line number), value)`` for each non-blank line of a JSON Lines text;
    ``ValueError`` naming the first line that is not JSON."""
    for line_no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where(line_no)}: not JSON ({err.msg})") from None
        yield where(line_no), value


def _jsonl_rows(path: Path) -> Iterator[tuple[str, Any]]:
    return jsonl_rows(read_text(path, "TL;DR file").splitlines(), lambda line_no: f"{path}:{line_no}")


def _tldr_rows(path_or_id: str, split: str) -> Iterable[tuple[str, Mapping[str, Any]]]:
    path = Path(path_or_id).expanduser()  # a spec's "tldr:~/posts.jsonl": no shell expands that "~"
    if path.suffix in DATA_FILE_SUFFIXES and not path.is_file():
        raise ValueError(f"TL;DR file {path} {'is a folder' if path.is_dir() else 'does not exist'}")
    if path.suffix in (".jsonl", ".json"):
        yield from _jsonl_rows(path)
        return
    import datasets

    if path.suffix == ".parquet":
        try:
            table = datasets.Dataset.from_parquet(str(path))
        except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
            raise ValueError(f"cannot read TL;DR file {path}: {err}") from None
    else:
        try:
            table = datasets.load_dataset(path_or_id, split=split)
        except Exception as err:  # noqa: BLE001 - datasets raises many types for a missing id
            raise ValueError(
                f"TL;DR data {path_or_id!r} is neither a .jsonl/.parquet file nor a loadable "
                f"datasets id (split {split!r}): {err}"
            ) from None
    for i, row in enumerate(table):
        yield f"{path_or_id}[{i}]", row


def load_tldr(path_or_id: str, split: str = "train") -> list[Example]:
    """Reddit TL;DR pairs from a local ``.jsonl``/``.parquet`` file or a ``datasets`` id."""
    examples = []
    for where, row in _tldr_rows(path_or_id, split):
        if not isinstance(row, Mapping):
            raise ValueError(f"{where}: a row must be a JSON object, got {type(row).__name__}")
        schema = next((keys for keys in TLDR_SCHEMAS if all(k in row for k in keys)), None)
        if schema is None:
            raise ValueError(
                f"{where}: no known TL;DR layout; expected one of the key pairs "
                f"{', '.join('/'.join(keys) for keys in TLDR_SCHEMAS)}, got keys {sorted(row)}"
            )
        source = _text(row, schema[0], where)
        if schema[0] == "prompt":  # "SUBREDDIT: ... POST: ...\nTL;DR:" -> the post part
            source = source.removesuffix("TL;DR:").strip()
        elif "title" in row and isinstance(row["title"], str):
            source = f"{row['title'].strip()}\n{source}"
        row_id = row.get("id")
        examples.append(Example(
            prompt_id=f"tldr/{row_id if row_id is not None else where}",
            instruction=TLDR_INSTRUCTION,
            source=source,
            reference=_text(row, schema[1], where),
        ))
    if not examples:
        raise ValueError(f"TL;DR data {path_or_id!r} has no rows")
    return examples


DATA_FILE_SUFFIXES = (".jsonl", ".json", ".parquet")  # tldr:PATH read as a local file, not a datasets id


def data_file(data: str) -> Path | None:
    """The local file of ``tldr:PATH`` data (a :data:`DATA_FILE_SUFFIXES` path); None for
    ACLSum and a ``datasets`` id."""
    kind, sep, target = data.partition(":")
    path = Path(target).expanduser()
    return path if kind == "tldr" and sep and path.suffix in DATA_FILE_SUFFIXES else None


def load_examples(data: str, aspect: str = "all") -> list[Example]:
    """``"aclsum"`` or ``"tldr:PATH_OR_ID"`` -> its examples; ACLSum's of one ``aspect`` (one
    of :data:`ACLSUM_ASPECTS`) or of all three (``"all"``)."""
    if aspect != "all" and (data != "aclsum" or aspect not in ACLSUM_ASPECTS):
        raise ValueError(f"aspect must be 'all' or, for data 'aclsum', one of {ACLSUM_ASPECTS}; "
                         f"got aspect {aspect!r} for data {data!r}")
    if data == "aclsum":
        return [e for e in load_aclsum() if aspect == "all" or e.prompt_id.endswith(f"/{aspect}")]
    kind, sep, target = data.partition(":")
    if kind == "tldr" and sep and target:
        return load_tldr(target)
    raise ValueError(f"data must be 'aclsum' or 'tldr:PATH_OR_ID', got {data!r}")


def split_examples(examples: Sequence[Example], num_eval: int, seed: int) -> Splits:
    """The held-out / SFT / RL split, the same for every run with this ``seed``.

    Shuffle with ``seed``; the first ``num_eval`` examples are the held-out evaluation prompts;
    every other example whose source text one of them has (ACLSum's other aspects of a held-out
    abstract) is dropped, so no held-out text is trained on; the rest is halved, SFT then RL.
    ``ValueError`` when that leaves no SFT or RL example; :func:`check_disjoint` holds.
    """
    if num_eval < 1:
        raise ValueError(f"num_eval must be >= 1, got {num_eval}")
    shuffled = list(examples)
    random.Random(seed).shuffle(shuffled)
    held_out = shuffled[:num_eval]
    sources = {e.source for e in held_out}
    rest = [e for e in shuffled[num_eval:] if e.source not in sources]
    if len(held_out) < num_eval or len(rest) < 2:
        raise ValueError(
            f"{len(examples)} examples cannot give {num_eval} held-out prompts and at least one SFT and one "
            f"RL example from other source texts (left: {len(rest)}); lower eval_prompts or use more data"
        )
    half = len(rest) // 2
    splits = Splits(sft=tuple(rest[:half]), rl=tuple(rest[half:]), eval=tuple(held_out))
    check_disjoint(splits)
    return splits


def cycle(examples: Sequence[Example], seed: int) -> Iterator[Example]:
    """``examples`` for ever, each round in a new order drawn from ``seed``: a run's SFT and RL streams
    (``LLMRun._stream`` gives each its seed)."""
    rng = random.Random(seed)
    while True:
        order = list(examples)
        rng.shuffle(order)
        yield from order


def drawn(examples: Sequence[Example], seed: int, n: int) -> list[Example]:
    """The examples among the first ``n`` of :func:`cycle` (``examples`` and ``seed``), each once."""
    if n >= len(examples):
        return list(examples)
    stream = cycle(examples, seed)
    return list({id(e): e for e in (next(stream) for _ in range(n))}.values())


def check_disjoint(splits: Splits) -> None:
    """``ValueError`` unless no held-out prompt's id or source text is among the SFT or RL examples."""
    held_ids, held_sources = {e.prompt_id for e in splits.eval}, {e.source for e in splits.eval}
    if len(held_ids) < len(splits.eval):
        raise ValueError("the held-out prompts repeat a prompt id")
    shared = [e.prompt_id for e in splits.sft + splits.rl if e.prompt_id in held_ids or e.source in held_sources]
    if shared:
        raise ValueError(f"{len(shared)} SFT/RL examples share a prompt id or source text with the held-out "
                         f"prompts (first: {shared[:3]})")


def shown_source(example: Example, max_source_words: int | None = None) -> str:
    """The source as the model sees it: its first ``max_source_words`` words (Reddit posts can
    be long), all of it where ``None`` or shorter."""
    source = example.source
    if max_source_words is not None and len(words := source.split()) > max_source_words:
        source = " ".join(words[:max_source_words])
    return source


def format_prompt(example: Example, tokenizer: Any, max_source_words: int | None = None) -> str:
    """The prompt text: the chat template's user turn where the tokenizer has one, else plain.

    The source is :func:`shown_source`.
    """
    message = f"{example.instruction}\n\n{shown_source(example, max_source_words)}"
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": message}], tokenize=False, add_generation_prompt=True
        )
    return f"{message}\nTL;DR:"
